<?php
// Dispatches SendEmail messages through a Symfony MessageBus routed to one transport.
//
//   php dispatch.php <dsn> <first id> <count> [<delayed every n>] [<class: SendEmail|Unmapped|Misfit>]
//
// Every n-th message (n > 0) carries a DelayStamp of one second. Prints the count sent.
declare(strict_types=1);

require __DIR__ . '/bootstrap.php';

use App\Message\Address;
use App\Message\Priority;
use App\Message\SendEmail;
use Symfony\Component\Messenger\Envelope;
use Symfony\Component\Messenger\MessageBus;
use Symfony\Component\Messenger\Middleware\SendMessageMiddleware;
use Symfony\Component\Messenger\Stamp\DelayStamp;
use Symfony\Component\Messenger\Transport\Sender\SendersLocator;

[$dsn, $first, $count] = [$argv[1] ?? courier_fail('usage: dispatch.php <dsn> <first id> <count> [<delayed every n>] [<class>]'), (int) ($argv[2] ?? 1), (int) ($argv[3] ?? 1)];
$delayedEvery = (int) ($argv[4] ?? 0);
$class = $argv[5] ?? 'SendEmail';

$transport = courier_transport($dsn);
$bus = new MessageBus([
    new SendMessageMiddleware(new SendersLocator(['*' => ['async']], new CourierContainer(['async' => $transport]))),
]);

for ($id = $first; $id < $first + $count; ++$id) {
    $message = match ($class) {
        'SendEmail' => new SendEmail(
            $id,
            "user$id@example.com",
            "Subject $id / Grüße",
            new Address("$id Main St", 'Köln'),
            new DateTimeImmutable('2024-05-06 07:08:09'),
            0 === $id % 2 ? Priority::High : Priority::Low,
            ["t$id"],
        ),
        'Unmapped' => new App\Message\Unmapped($id),
        'Misfit' => new App\Message\Misfit("not a number $id"),
        default => courier_fail("unknown class $class"),
    };
    $stamps = $delayedEvery > 0 && 0 === $id % $delayedEvery ? [new DelayStamp(1000)] : [];
    $bus->dispatch(new Envelope($message, $stamps));
}
echo $count, "\n";
