//! Courier amqp (work in progress).
