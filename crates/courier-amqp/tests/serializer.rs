//! A RabbitMQ queue holding JSON and MessagePack messages (`serializer=msgpack` producers) is
//! consumed whole: consumers decode by each message's content type.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn amqp_json_and_msgpack_messages_on_one_queue_are_both_consumed() {
    let h = common::harness().await;
    courier_test::serializer::json_and_msgpack_producers_are_both_consumed(&h).await;
}

#[test]
fn the_serializer_option_is_read_from_the_dsn() {
    let dsn = courier_core::Dsn::parse("amqp://guest:guest@127.0.0.1:5672/%2f?serializer=msgpack")
        .unwrap_or_else(|e| panic!("{e}"));
    let options = courier_amqp::AmqpOptions::from_dsn("q", &dsn).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        options,
        courier_amqp::AmqpOptions::from_dsn(
            "q",
            &courier_core::Dsn::parse("amqp://guest:guest@127.0.0.1:5672/%2f")
                .unwrap_or_else(|e| panic!("{e}"))
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .serializer(courier_core::Serializer::MessagePack)
    );
    let bad = courier_core::Dsn::parse("amqp://127.0.0.1/%2f?serializer=xml")
        .unwrap_or_else(|e| panic!("{e}"));
    let err = courier_amqp::AmqpOptions::from_dsn("q", &bad).expect_err("xml is no serializer");
    assert!(err.contains("unknown serializer"), "{err}");
}
