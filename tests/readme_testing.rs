//! The book's "Testing your handlers" snippet (docs/src/guides/testing.md), compiled and run as
//! a test: the code between the `README snippet` markers below is that page's code block,
//! character for character (the last test checks that the page shows it).

// README snippet begins
use courier::testing::run_until_empty;
use courier::{DelayStamp, Envelope, HandlerError, InMemoryTransport, Message, MessageBus, Worker};
use serde::{Deserialize, Serialize};
use std::{sync::Arc, time::Duration};

#[derive(Serialize, Deserialize)]
struct Signup {
    email: String,
}
impl Message for Signup {
    const NAME: &'static str = "users.signup";
}

#[derive(Serialize, Deserialize)]
struct Mail {
    to: String,
    template: String,
}
impl Message for Mail {
    const NAME: &'static str = "mail.send";
}

const THREE_DAYS: Duration = Duration::from_secs(3 * 86_400);

/// The handler under test: a welcome mail now, tips in three days.
async fn on_signup(m: Arc<Signup>) -> Result<(), HandlerError> {
    let bus = MessageBus::current().expect("inside a handler");
    let mail = |template: &str| Mail {
        to: m.email.clone(),
        template: template.into(),
    };
    bus.dispatch(mail("welcome")).await?;
    bus.dispatch(Envelope::new(mail("tips")).with(DelayStamp(THREE_DAYS)))
        .await?;
    Ok(())
}

#[tokio::test(start_paused = true)] // tokio's clock jumps over delays and retry backoffs
async fn signup_mails_now_and_in_three_days() {
    let queue = Arc::new(InMemoryTransport::new());
    let bus = MessageBus::builder()
        .transport("async", queue.clone())
        .route("*", ["async"])
        .handler_fn("on_signup", on_signup)
        .handler_fn("send_mail", |_: Arc<Mail>| async {
            Ok::<(), HandlerError>(())
        })
        .build();
    bus.dispatch(Signup {
        email: "ada@example.com".into(),
    })
    .await
    .expect("dispatched");

    // Until the queue is empty: three days of tokio time, a fraction of a second of yours.
    let worker = Worker::builder(bus)
        .receiver("async", queue.clone())
        .build();
    let stats = run_until_empty(worker).await.expect("the worker ran");
    assert_eq!(stats.handled, 3);

    queue.assert_dispatched::<Signup>(); // each assert_dispatched* checks one off
    let welcome = queue.assert_dispatched_where::<Mail>(|m| m.template == "welcome");
    assert_eq!(welcome.to, "ada@example.com");
    let tips = queue.assert_dispatched_where::<Mail>(|m| m.template == "tips");
    assert_eq!(tips.stamp::<DelayStamp>(), Some(&DelayStamp(THREE_DAYS)));
    queue.assert_nothing_else_dispatched(); // panics listing anything not checked off
}
// README snippet ends

#[test]
fn the_testing_guide_shows_this_snippet() {
    let me = include_str!("readme_testing.rs");
    let begin = "// README snippet begins\n";
    let start = me.find(begin).expect("begin marker") + begin.len();
    let end = me.find("// README snippet ends").expect("end marker");
    let snippet = format!("```rust\n{}```", &me[start..end]);
    let page = include_str!("../docs/src/guides/testing.md");
    assert!(
        page.contains(&snippet),
        "docs/src/guides/testing.md's code block must be tests/readme_testing.rs's snippet, \
         verbatim:\n{snippet}"
    );
}
