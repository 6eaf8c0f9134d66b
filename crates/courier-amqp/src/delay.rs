//! Delays without the broker's delayed-message plugin: per-bucket TTL queues that dead-letter
//! back when their TTL runs out.
//!
//! A delay is rounded **up** to the next value of the series 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5,
//! 4, 5, 6, 7, 8 times a power of ten milliseconds (minimum 10 ms), so a message is never early
//! and at most 25 % late, and there are at most 13 bucket queues per decade of delays. Each
//! bucket `B` has two classic durable queues, declared on first use, bound to the headers
//! exchange `<exchange>.delay`:
//!
//! - `<exchange>.delay.<B>`: `x-message-ttl=B`, dead-letters to `<exchange>` with the message's
//!   original routing key, so a delayed send is routed exactly as an immediate one;
//! - `<exchange>.retry.<B>`: `x-message-ttl=B`, dead-letters to the default exchange, where the
//!   routing key is the name of the queue that failed, so a retry reaches only that queue.
//!
//! The delay queues carry no `x-expires` (a queue that expires with messages in it loses them);
//! they are empty whenever no delayed message is waiting.

use std::time::Duration;

/// The longest delay honoured (30 days; the bucket stays below AMQP's 32-bit TTL limit).
pub const MAX_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);

/// The header that routes a delayed message to its bucket queue (removed on receive). It must
/// not start with `x-`: headers exchanges ignore such headers when matching.
pub(crate) const DELAY_HEADER: &str = "courier-delay-bucket";

const SERIES: [u64; 13] = [
    100, 125, 150, 175, 200, 250, 300, 350, 400, 500, 600, 700, 800,
];

/// The bucket (TTL in milliseconds) a delay is rounded up to.
#[must_use]
pub fn bucket(delay: Duration) -> u64 {
    let ms = u64::try_from(delay.as_nanos().div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(10);
    let mut decade: u64 = 10; // series value 100 means 1.00 x decade
    loop {
        for s in SERIES {
            let candidate = (s * decade).div_ceil(100);
            if candidate >= ms {
                return candidate;
            }
        }
        match decade.checked_mul(10) {
            Some(d) if d <= u64::MAX / 1000 => decade = d,
            _ => return ms,
        }
    }
}

/// Where a delayed message goes when its TTL runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum DelayRoute {
    /// Back to the transport's exchange with the original routing key.
    Exchange,
    /// To one queue, through the default exchange.
    Queue,
}

impl DelayRoute {
    pub(crate) fn header_value(self, bucket: u64) -> String {
        match self {
            Self::Exchange => format!("exchange:{bucket}"),
            Self::Queue => format!("queue:{bucket}"),
        }
    }

    pub(crate) fn queue_name(self, exchange: &str, bucket: u64) -> String {
        match self {
            Self::Exchange => format!("{exchange}.delay.{bucket}"),
            Self::Queue => format!("{exchange}.retry.{bucket}"),
        }
    }

    /// The dead-letter exchange of the bucket queue.
    pub(crate) fn dead_letter_exchange(self, exchange: &str) -> String {
        match self {
            Self::Exchange => exchange.to_owned(),
            Self::Queue => String::new(),
        }
    }
}

/// The headers exchange the bucket queues are bound to.
pub(crate) fn delay_exchange(exchange: &str) -> String {
    format!("{exchange}.delay")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_to_the_series_never_down() {
        let ms = Duration::from_millis;
        assert_eq!(bucket(ms(0)), 10);
        assert_eq!(bucket(ms(10)), 10);
        assert_eq!(bucket(ms(11)), 13);
        assert_eq!(bucket(ms(100)), 100);
        assert_eq!(bucket(ms(101)), 125);
        assert_eq!(bucket(ms(1000)), 1000);
        assert_eq!(bucket(ms(1001)), 1250);
        assert_eq!(bucket(ms(1500)), 1500);
        assert_eq!(bucket(ms(1999)), 2000);
        assert_eq!(bucket(Duration::from_micros(1_000_001)), 1250);
        for d in (1..5000).step_by(7) {
            let b = bucket(ms(d));
            assert!(b >= d && b * 100 <= d.max(10) * 125 + 100, "{d} -> {b}");
        }
    }

    #[test]
    fn the_largest_delay_fits_in_a_32_bit_ttl() {
        assert!(bucket(MAX_DELAY) <= u64::from(u32::MAX));
    }
}
