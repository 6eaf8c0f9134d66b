//! `outbox-worker`: the `courier` command line (`relay`, `consume`...) plus the outbox crash
//! tests' message `outbox.order`, whose handler records its side effect (a row of the table
//! `OUTBOX_EFFECTS` in the PostgreSQL database `OUTBOX_DB`) and claims its message id in the
//! inbox `OUTBOX_INBOX`, in one transaction; the inbox is also the bus's middleware. With
//! `OUTBOX_PAUSE_AFTER_COMMIT=FILE`, the first handler to commit writes FILE and stops forever
//! before returning, so the test kills the process after the commit and before the ack. With
//! `OUTBOX_RELAY_PAUSE=after_confirm|after_delete` and `OUTBOX_RELAY_PAUSE_FILE=FILE`, `relay`
//! writes FILE at that point of its first batch and stops forever (see [`RelayPause`]): the
//! relay's fault point lives here, not in the `courier` binary.

use std::process::ExitCode;
use std::sync::OnceLock;

use courier_chaos::outbox::{OutboxHandler, OutboxOrder, OutboxSettings, RelayPause};

fn main() -> ExitCode {
    let (settings, pause) =
        match OutboxSettings::from_env().and_then(|s| Ok((s, RelayPause::from_env()?))) {
            Ok(read) => read,
            Err(e) => {
                eprintln!("outbox-worker: {e}");
                return ExitCode::from(2);
            }
        };
    let handler: OnceLock<OutboxHandler> = OnceLock::new();
    let mut app = courier_cli::App::new();
    if let Some(pause) = pause {
        app = app.configure_relay(move |options| pause.apply(options));
    }
    app.message::<OutboxOrder>()
        .configure_bus(move |bus| {
            // Built inside the runtime, once: the pool connects lazily.
            let h = handler.get_or_init(|| match settings.handler() {
                Ok(h) => h,
                Err(e) => {
                    eprintln!("outbox-worker: {e}");
                    std::process::exit(2);
                }
            });
            bus.middleware(h.inbox())
                .handler_named::<OutboxOrder, _>("outbox.effect", h.clone())
        })
        .run()
}
