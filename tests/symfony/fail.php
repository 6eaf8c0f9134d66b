<?php
// Runs a Symfony Worker on one transport (receiver `async`) whose handler fails every message,
// with no retry: Symfony's listeners add an ErrorDetailsStamp and send each message to the
// failure transport, as `failure_transport` does in a Symfony app. Prints one JSON line per
// message it fails: {"class", "id"}.
//
//   php fail.php <dsn> <failure dsn> <message limit> <time limit in seconds>
declare(strict_types=1);

require __DIR__ . '/bootstrap.php';

use Symfony\Component\EventDispatcher\EventDispatcher;
use Symfony\Component\Messenger\Envelope;
use Symfony\Component\Messenger\EventListener\AddErrorDetailsStampListener;
use Symfony\Component\Messenger\EventListener\SendFailedMessageToFailureTransportListener;
use Symfony\Component\Messenger\EventListener\StopWorkerOnMessageLimitListener;
use Symfony\Component\Messenger\EventListener\StopWorkerOnTimeLimitListener;
use Symfony\Component\Messenger\MessageBus;
use Symfony\Component\Messenger\Middleware\MiddlewareInterface;
use Symfony\Component\Messenger\Middleware\StackInterface;
use Symfony\Component\Messenger\Worker;

[$dsn, $failureDsn, $limit, $seconds] = [
    $argv[1] ?? courier_fail('usage: fail.php <dsn> <failure dsn> <message limit> <seconds>'),
    $argv[2] ?? courier_fail('usage: fail.php <dsn> <failure dsn> <message limit> <seconds>'),
    (int) ($argv[3] ?? 1),
    (int) ($argv[4] ?? 10),
];

final class FailMiddleware implements MiddlewareInterface
{
    public function handle(Envelope $envelope, StackInterface $stack): Envelope
    {
        $message = $envelope->getMessage();
        echo json_encode(['class' => get_class($message), 'id' => $message->id ?? null]), "\n";

        throw new RuntimeException('failed in PHP for good: ' . ($message->id ?? '?'));
    }
}

$transport = courier_transport($dsn);
$failure = courier_transport($failureDsn);
$dispatcher = new EventDispatcher();
$dispatcher->addSubscriber(new AddErrorDetailsStampListener());
$dispatcher->addSubscriber(new SendFailedMessageToFailureTransportListener(new CourierContainer(['async' => $failure])));
$dispatcher->addSubscriber(new StopWorkerOnMessageLimitListener($limit));
$dispatcher->addSubscriber(new StopWorkerOnTimeLimitListener($seconds));

$worker = new Worker(['async' => $transport], new MessageBus([new FailMiddleware()]), $dispatcher);
$worker->run(['sleep' => 50000]);
