<?php
// The PHP side of Courier's Symfony interop tests: Debian's Symfony Messenger 5.4 and its bridges,
// loaded through Debian's autoloaders (no Composer), with a Serializer equivalent to a Symfony
// app's `messenger.transport.symfony_serializer` (the app's serializer: backed enums, dates,
// arrays, objects with their property types).
declare(strict_types=1);

error_reporting(E_ALL & ~E_DEPRECATED & ~E_USER_DEPRECATED);

require_once '/usr/share/php/Symfony/Component/Messenger/autoload.php';
require_once '/usr/share/php/Symfony/Component/Messenger/Bridge/Doctrine/autoload.php';
require_once '/usr/share/php/Symfony/Component/Messenger/Bridge/Redis/autoload.php';
require_once '/usr/share/php/Symfony/Component/Messenger/Bridge/Amqp/autoload.php';
require_once '/usr/share/php/Symfony/Component/Serializer/autoload.php';
require_once '/usr/share/php/Symfony/Component/PropertyAccess/autoload.php';
require_once '/usr/share/php/Symfony/Component/PropertyInfo/autoload.php';
require_once '/usr/share/php/Symfony/Component/EventDispatcher/autoload.php';
require_once '/usr/share/php/Doctrine/DBAL/autoload.php';
require_once __DIR__ . '/messages.php';

use Symfony\Component\Messenger\Transport\Serialization\Serializer;
use Symfony\Component\PropertyInfo\Extractor\ReflectionExtractor;
use Symfony\Component\Serializer\Encoder\JsonEncoder;
use Symfony\Component\Serializer\Normalizer\ArrayDenormalizer;
use Symfony\Component\Serializer\Normalizer\BackedEnumNormalizer;
use Symfony\Component\Serializer\Normalizer\DateTimeNormalizer;
use Symfony\Component\Serializer\Normalizer\ObjectNormalizer;
use Symfony\Component\Serializer\Serializer as SymfonySerializer;

/** The `messenger.transport.symfony_serializer` of a Symfony app. */
function courier_symfony_serializer(): Serializer
{
    $normalizers = [
        new BackedEnumNormalizer(),
        new DateTimeNormalizer(),
        new ArrayDenormalizer(),
        new ObjectNormalizer(null, null, null, new ReflectionExtractor()),
    ];

    return new Serializer(new SymfonySerializer($normalizers, [new JsonEncoder()]));
}

/** Exits with a message on stderr (what the Rust test shows when PHP fails). */
function courier_fail(string $why): never
{
    fwrite(STDERR, $why . "\n");
    exit(2);
}

/** A transport from a Messenger DSN, with the Symfony serializer. */
function courier_transport(string $dsn, array $options = []): Symfony\Component\Messenger\Transport\TransportInterface
{
    $serializer = courier_symfony_serializer();
    if (str_starts_with($dsn, 'doctrine://')) {
        // doctrine://<dbal url>?table_name=...&queue_name=... : the DBAL connection from the URL.
        $rest = substr($dsn, strlen('doctrine://'));
        [$url, $query] = array_pad(explode('#', $rest, 2), 2, '');
        parse_str($query, $opts);
        $conn = Doctrine\DBAL\DriverManager::getConnection(['url' => $url]);
        // What DoctrineTransportFactory picks: LISTEN/NOTIFY's connection on PostgreSQL.
        $class = $conn->getDatabasePlatform() instanceof Doctrine\DBAL\Platforms\PostgreSQLPlatform
            ? Symfony\Component\Messenger\Bridge\Doctrine\Transport\PostgreSqlConnection::class
            : Symfony\Component\Messenger\Bridge\Doctrine\Transport\Connection::class;
        $config = $class::buildConfiguration('doctrine://default', $opts + $options);
        $connection = new $class($config, $conn);

        return new Symfony\Component\Messenger\Bridge\Doctrine\Transport\DoctrineTransport($connection, $serializer);
    }
    if (str_starts_with($dsn, 'redis://')) {
        return new Symfony\Component\Messenger\Bridge\Redis\Transport\RedisTransport(
            Symfony\Component\Messenger\Bridge\Redis\Transport\Connection::fromDsn($dsn, $options), $serializer);
    }
    if (str_starts_with($dsn, 'amqp://')) {
        return new Symfony\Component\Messenger\Bridge\Amqp\Transport\AmqpTransport(
            Symfony\Component\Messenger\Bridge\Amqp\Transport\Connection::fromDsn($dsn, $options), $serializer);
    }
    courier_fail("unknown DSN scheme: $dsn");
}

/** A PSR-11 container of a few services (the senders and retry strategies by transport name). */
final class CourierContainer implements Psr\Container\ContainerInterface
{
    public function __construct(private array $services)
    {
    }

    public function get(string $id): mixed
    {
        return $this->services[$id] ?? courier_fail("no service $id");
    }

    public function has(string $id): bool
    {
        return isset($this->services[$id]);
    }
}

/** The retry count of an envelope, as Symfony reads it (its last RedeliveryStamp). */
function courier_retry_count(Symfony\Component\Messenger\Envelope $envelope): int
{
    return Symfony\Component\Messenger\Stamp\RedeliveryStamp::getRetryCountFromEnvelope($envelope);
}
