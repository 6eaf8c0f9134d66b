<?php
// Runs a Symfony Worker on one transport, with Symfony's retry listener (retries go back to the
// same transport, as `retry_strategy` does by default) and prints one JSON line per message it
// receives: {"class", "id", "retry", "subject", "priority", "sentAt"}.
//
//   php consume.php <dsn> <message limit> <time limit in seconds> [ok|fail-new]
//
// `fail-new` fails every message whose retry count is 0: Symfony retries it (count + 1, one
// second later) into the transport.
declare(strict_types=1);

require __DIR__ . '/bootstrap.php';

use Symfony\Component\EventDispatcher\EventDispatcher;
use Symfony\Component\Messenger\Envelope;
use Symfony\Component\Messenger\EventListener\SendFailedMessageForRetryListener;
use Symfony\Component\Messenger\EventListener\StopWorkerOnMessageLimitListener;
use Symfony\Component\Messenger\EventListener\StopWorkerOnTimeLimitListener;
use Symfony\Component\Messenger\MessageBus;
use Symfony\Component\Messenger\Middleware\MiddlewareInterface;
use Symfony\Component\Messenger\Middleware\StackInterface;
use Symfony\Component\Messenger\Retry\MultiplierRetryStrategy;
use Symfony\Component\Messenger\Worker;

[$dsn, $limit, $seconds] = [$argv[1] ?? courier_fail('usage: consume.php <dsn> <message limit> <seconds> [ok|fail-new]'), (int) ($argv[2] ?? 1), (int) ($argv[3] ?? 10)];
$mode = $argv[4] ?? 'ok';

final class RecordMiddleware implements MiddlewareInterface
{
    public function __construct(private string $mode)
    {
    }

    public function handle(Envelope $envelope, StackInterface $stack): Envelope
    {
        $message = $envelope->getMessage();
        $retry = courier_retry_count($envelope);
        echo json_encode([
            'class' => get_class($message),
            'id' => $message->id ?? null,
            'retry' => $retry,
            'subject' => $message->subject ?? null,
            'priority' => isset($message->priority) ? $message->priority->value : null,
            'sentAt' => isset($message->sentAt) ? $message->sentAt->format(DATE_ATOM) : null,
        ]), "\n";
        if ('fail-new' === $this->mode && 0 === $retry) {
            throw new RuntimeException('failed in PHP on purpose');
        }

        return $stack->next()->handle($envelope, $stack);
    }
}

$transport = courier_transport($dsn);
$dispatcher = new EventDispatcher();
$dispatcher->addSubscriber(new SendFailedMessageForRetryListener(
    new CourierContainer(['async' => $transport]),
    new CourierContainer(['async' => new MultiplierRetryStrategy(3, 1000, 1)]),
));
$dispatcher->addSubscriber(new StopWorkerOnMessageLimitListener($limit));
$dispatcher->addSubscriber(new StopWorkerOnTimeLimitListener($seconds));

$worker = new Worker(['async' => $transport], new MessageBus([new RecordMiddleware($mode)]), $dispatcher);
$worker->run(['sleep' => 50000]);
