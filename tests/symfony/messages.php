<?php
// The messages of the interop tests' PHP app (their Rust twins are in crates/courier-symfony/tests).
declare(strict_types=1);

namespace App\Message;

enum Priority: string
{
    case Low = 'low';
    case High = 'high';
}

final class Address
{
    public function __construct(public string $street = '', public string $city = '')
    {
    }
}

final class SendEmail
{
    public function __construct(
        public int $id = 0,
        public string $to = '',
        public string $subject = '',
        public ?Address $address = null,
        public ?\DateTimeImmutable $sentAt = null,
        public Priority $priority = Priority::Low,
        public array $tags = [],
    ) {
    }
}

/** A message Courier has no Rust type for. */
final class Unmapped
{
    public function __construct(public int $id = 0)
    {
    }
}

/** A message whose body does not fit Courier's Rust type (`id` is a string here). */
final class Misfit
{
    public function __construct(public string $id = '')
    {
    }
}

namespace App\Stamp;

use Symfony\Component\Messenger\Stamp\StampInterface;

/** A stamp of the PHP app that Courier does not know: it travels verbatim. */
final class TenantStamp implements StampInterface
{
    public function __construct(private string $tenant)
    {
    }

    public function getTenant(): string
    {
        return $this->tenant;
    }
}
