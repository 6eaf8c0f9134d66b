<?php
// Writes the golden vectors under golden/ from real Symfony Messenger output; the Rust tests in
// crates/courier-symfony/tests/golden.rs check Courier against them byte for byte.
//
//   TZ=UTC php tests/symfony/golden.php redis://127.0.0.1:6379
//
// Each vector is `<name>.body` (the body bytes) and `<name>.headers` (the headers as PHP's
// json_encode writes them: the Doctrine `headers` column), or `<name>.field` (a Redis `message`
// field's bytes), or `<name>.row` (a Doctrine row's `body` and `headers` columns, one JSON object).
declare(strict_types=1);

require __DIR__ . '/bootstrap.php';

use App\Message\Address;
use App\Message\Priority;
use App\Message\SendEmail;
use Symfony\Component\Messenger\Envelope;
use Symfony\Component\Messenger\Stamp as S;
use Symfony\Component\Messenger\Transport\Serialization\PhpSerializer;

$redisDsn = $argv[1] ?? courier_fail('usage: golden.php <redis://host:port>');
$dir = __DIR__ . '/golden';
@mkdir($dir);
date_default_timezone_set('UTC');

function email(string $subject = 'Grüße/€ "quoted"'): SendEmail
{
    return new SendEmail(
        7,
        'a@example.com',
        $subject,
        new Address('1 Main St', 'Köln'),
        new DateTimeImmutable('2024-05-06 07:08:09', new DateTimeZone('UTC')),
        Priority::High,
        ['x', 'y'],
    );
}

function write_encoded(string $dir, string $name, array $encoded): void
{
    file_put_contents("$dir/$name.body", $encoded['body']);
    file_put_contents("$dir/$name.headers", json_encode($encoded['headers'] ?? []));
}

$serializer = courier_symfony_serializer();
$at = new DateTimeImmutable('2024-05-06 07:08:09', new DateTimeZone('UTC'));

// A nested DTO, a DateTime, a backed enum; no stamps.
write_encoded($dir, 'send_email', $serializer->encode(new Envelope(email())));
// A DateTime in another zone keeps its offset.
$paris = new SendEmail(8, 'b@example.com', 'Paris', null, new DateTimeImmutable('2024-01-02 03:04:05', new DateTimeZone('Europe/Paris')), Priority::Low, []);
write_encoded($dir, 'send_email_paris', $serializer->encode(new Envelope($paris)));
// Every stamp Courier maps, in the order Courier writes them.
write_encoded($dir, 'all_stamps', $serializer->encode(new Envelope(email(), [
    new S\BusNameStamp('messenger.bus.default'),
    new S\DelayStamp(5000),
    new S\RedeliveryStamp(1, $at),
    new S\RedeliveryStamp(2, $at->modify('+1 second')),
    new S\ErrorDetailsStamp('RuntimeException', 0, 'boom'),
    new S\SentToFailureTransportStamp('async'),
    new S\TransportMessageIdStamp('42'),
])));
// A stamp Courier does not know, kept verbatim.
write_encoded($dir, 'unknown_stamp', $serializer->encode(new Envelope(email(), [
    new S\BusNameStamp('messenger.bus.default'),
    new App\Stamp\TenantStamp('acme'),
])));

// PhpSerializer: addslashes(serialize($envelope)), text and base64.
$php = new PhpSerializer();
write_encoded($dir, 'php_serializer', $php->encode(new Envelope(email(), [
    new S\BusNameStamp('messenger.bus.default'),
    new S\RedeliveryStamp(2, $at),
    new S\DelayStamp(1000),
])));
write_encoded($dir, 'php_serializer_base64', $php->encode(new Envelope(email("bytes \xff\xfe"), [])));

// A Doctrine row written through PhpSerializer: headers `[]`.
$db = tempnam(sys_get_temp_dir(), 'courier-golden') . '.sqlite';
$conn = Doctrine\DBAL\DriverManager::getConnection(['url' => "sqlite:///$db"]);
$config = Symfony\Component\Messenger\Bridge\Doctrine\Transport\Connection::buildConfiguration('doctrine://default');
$doctrine = new Symfony\Component\Messenger\Bridge\Doctrine\Transport\DoctrineTransport(
    new Symfony\Component\Messenger\Bridge\Doctrine\Transport\Connection($config, $conn), $php);
$doctrine->send(new Envelope(new App\Message\Unmapped(3)));
$row = $conn->fetchAssociative('SELECT body, headers FROM messenger_messages');
file_put_contents("$dir/doctrine_headers_empty.row", json_encode($row));
unlink($db);

// Redis `message` fields as phpredis stores them, with its PHP serializer (the default) and without.
$url = parse_url($redisDsn);
$raw = new Redis();
$raw->connect($url['host'], $url['port'] ?? 6379);
foreach (['1' => 'redis_serializer_php', '0' => 'redis_serializer_none'] as $flag => $name) {
    $stream = 'courier_golden_' . bin2hex(random_bytes(4));
    $transport = courier_transport("redis://{$url['host']}:" . ($url['port'] ?? 6379) . "/$stream?serializer=$flag&delete_after_ack=true");
    $transport->send(new Envelope(email(), [new S\BusNameStamp('messenger.bus.default')]));
    $entries = $raw->xRange($stream, '-', '+');
    file_put_contents("$dir/$name.field", reset($entries)['message']);
    $raw->del($stream, "{$stream}__queue");
}
// A delayed message as PHP's Connection::add writes it in `<stream>__queue` (plain JSON with a
// uniqid, never through phpredis's serializer), and the entry PHP's get() moves it to when due.
$stream = 'courier_golden_' . bin2hex(random_bytes(4));
$transport = courier_transport("redis://{$url['host']}:" . ($url['port'] ?? 6379) . "/$stream?delete_after_ack=true");
$transport->send(new Envelope(email(), [new S\BusNameStamp('messenger.bus.default'), new S\DelayStamp(1)]));
$members = $raw->zRange("{$stream}__queue", 0, -1);
file_put_contents("$dir/redis_queue_member.member", reset($members));
usleep(20000);
foreach ($transport->get() as $moved) {
}
$entries = $raw->xRange($stream, '-', '+');
file_put_contents("$dir/redis_queue_moved.field", reset($entries)['message']);
$raw->del($stream, "{$stream}__queue");
echo "golden vectors written to $dir\n";
