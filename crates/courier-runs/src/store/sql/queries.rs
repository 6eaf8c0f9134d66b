//! The SQL text of every transition: one template each, rendered with
//! [`Dialect::render`](courier_sql::Dialect::render) for the dialect and table names.

use courier_sql::Dialect;

pub(super) const COLUMNS: &str = "id, agent, status, input, output, error_class, termination_reason, claimed_by, \
    lease_expires, requeue_count, pending_effect, created_at, started_at, finished_at, updated_at, due_at, \
    budget, used_tokens_in, used_tokens_out, used_cost, used_tool_calls, used_turns, steps_replayed, wait_signal, concurrency_key";
const NON_TERMINAL: &str =
    "('queued', 'running', 'waiting_for_approval', 'waiting_for_input', 'waiting')";
const STALE: &str = "status = 'running' AND lease_expires > 0 AND lease_expires < {now}";
/// A queued run past its due time by more than the bound threshold (ms).
const OVERDUE: &str = "status = 'queued' AND due_at < {now} - ?";

#[derive(Debug)]
pub(super) struct Queries {
    pub(super) now: String,
    pub(super) insert_queued: String,
    pub(super) insert_interactive: String,
    pub(super) clear_unique: String,
    pub(super) insert_unique: String,
    pub(super) unique_holder: String,
    pub(super) find: String,
    /// MySQL: the row a claim took, read back with whether it has journaled steps (None on the
    /// other dialects, whose claim returns the row).
    pub(super) find_claimed: Option<String>,
    pub(super) list_all: String,
    pub(super) list_status: String,
    pub(super) claim: String,
    pub(super) renew: String,
    pub(super) requeue_owned: String,
    pub(super) select_stale: String,
    pub(super) select_overdue: String,
    pub(super) redispatch_overdue: String,
    pub(super) redispatch_queued: String,
    pub(super) requeue_stale: String,
    pub(super) dead_letter_stale: String,
    pub(super) settle_owned: String,
    pub(super) settle_interactive: String,
    pub(super) fail_queued: String,
    pub(super) resume: String,
    pub(super) cancel: String,
    pub(super) effect_owned: String,
    pub(super) effect_interactive: String,
    pub(super) append_event: String,
    pub(super) max_seq: String,
    pub(super) events: String,
}

impl Queries {
    /// `insert_returning`: inserts use `INSERT ... RETURNING` (PostgreSQL, SQLite). The claim's
    /// `UPDATE ... RETURNING` is read from the dialect (all but MySQL/MariaDB).
    pub(super) fn new(dialect: Dialect, runs: &str, events: &str, insert_returning: bool) -> Self {
        let update_returning = dialect != Dialect::Mysql;
        let returning = |yes: bool, what: &str| {
            if yes {
                format!(" RETURNING {what}")
            } else {
                String::new()
            }
        };
        let insert_returns_run = returning(insert_returning, "{cols}");
        let render = |sql: &str| {
            dialect.render(
                &sql.replace("{stale}", STALE)
                    .replace("{overdue}", OVERDUE)
                    .replace("{nonterminal}", NON_TERMINAL)
                    .replace("{runs}", runs)
                    .replace("{events}", events)
                    // Without INSERT ... RETURNING, MAX(seq) is read back instead.
                    .replace("{returning_seq}", &returning(insert_returning, "seq"))
                    .replace("{returning_run}", &insert_returns_run)
                    // Without UPDATE ... RETURNING, the claimed row is read back instead.
                    // A claim also says whether the run has journaled steps, so that a fresh
                    // run's first step does not read an empty journal.
                    .replace(
                        "{returning_claimed}",
                        &returning(
                            update_returning,
                            &format!(
                                "{{cols}}, CAST(CASE WHEN EXISTS (SELECT 1 FROM {runs}_steps \
                                 WHERE run_id = {runs}.id) THEN 1 ELSE 0 END AS BIGINT) AS has_steps"
                            ),
                        ),
                    )
                    .replace("{cols}", COLUMNS),
            )
        };
        let requeue = "status = 'queued', requeue_count = requeue_count + 1, claimed_by = NULL, lease_expires = 0, \
            updated_at = {now}";
        // due_at is written first so that its `?` (the delay) is the first placeholder.
        let requeue_later = format!("due_at = {{now}} + ?, {requeue}");
        Self {
            now: render("SELECT {now}"),
            insert_queued: render(
                "INSERT INTO {runs} (id, agent, status, input, budget, concurrency_key, lease_expires, requeue_count, \
                 created_at, updated_at, due_at) VALUES (?, ?, 'queued', ?, ?, ?, 0, 0, {now}, {now}, {now}){returning_run}",
            ),
            // An expired key is cleared, so that the unique index lets the next run take it.
            clear_unique: render(
                "UPDATE {runs} SET unique_key = NULL WHERE unique_key = ? AND unique_until <= {now}",
            ),
            // A key held already: no row (PostgreSQL, SQLite: ON CONFLICT on the unique index;
            // MySQL: INSERT IGNORE, the key fitting its column, so nothing else is ignored).
            insert_unique: render(&format!(
                "INSERT {ignore}INTO {{runs}} (id, agent, status, input, budget, concurrency_key, lease_expires, \
                 requeue_count, created_at, updated_at, due_at, unique_key, unique_until) \
                 VALUES (?, ?, 'queued', ?, ?, ?, 0, 0, {{now}}, {{now}}, {{now}}, ?, {{now}} + ?){conflict}{{returning_run}}",
                ignore = if dialect == Dialect::Mysql {
                    "IGNORE "
                } else {
                    ""
                },
                conflict = if dialect == Dialect::Mysql {
                    ""
                } else {
                    " ON CONFLICT (unique_key) DO NOTHING"
                },
            )),
            unique_holder: render(
                "SELECT id FROM {runs} WHERE unique_key = ? AND unique_until > {now}",
            ),
            insert_interactive: render(
                "INSERT INTO {runs} (id, agent, status, input, budget, concurrency_key, lease_expires, requeue_count, \
                 created_at, started_at, updated_at) VALUES (?, ?, 'running', ?, ?, ?, 0, 0, {now}, {now}, {now}){returning_run}",
            ),
            find: render("SELECT {cols} FROM {runs} WHERE id = ?"),
            find_claimed: (dialect == Dialect::Mysql).then(|| {
                render(&format!(
                    "SELECT {{cols}}, CAST(CASE WHEN EXISTS (SELECT 1 FROM {runs}_steps WHERE run_id = {runs}.id) \
                     THEN 1 ELSE 0 END AS SIGNED) AS has_steps FROM {{runs}} WHERE id = ?"
                ))
            }),
            list_all: render("SELECT {cols} FROM {runs} ORDER BY created_at DESC, id DESC LIMIT ?"),
            list_status: render(
                "SELECT {cols} FROM {runs} WHERE status = ? ORDER BY created_at DESC, id DESC LIMIT ?",
            ),
            claim: render(
                "UPDATE {runs} SET status = 'running', claimed_by = ?, lease_expires = {now} + ?, \
                 started_at = COALESCE(started_at, {now}), updated_at = {now} WHERE id = ? AND status = 'queued'\
                 {returning_claimed}",
            ),
            renew: render(
                "UPDATE {runs} SET lease_expires = {now} + ?, updated_at = {now} \
                 WHERE id = ? AND status = 'running' AND claimed_by = ?",
            ),
            requeue_owned: render(&format!(
                "UPDATE {{runs}} SET {requeue_later} WHERE id = ? AND status = 'running' AND claimed_by = ?"
            )),
            select_stale: render(
                "SELECT {cols} FROM {runs} WHERE {stale} ORDER BY lease_expires LIMIT ?",
            ),
            requeue_stale: render(&format!(
                "UPDATE {{runs}} SET due_at = {{now}}, {requeue} WHERE id = ? AND {{stale}}"
            )),
            select_overdue: render(
                "SELECT {cols} FROM {runs} WHERE {overdue} ORDER BY due_at LIMIT ?",
            ),
            // Moving due_at to now is what makes a second reaper's identical UPDATE match nothing.
            redispatch_overdue: render(
                "UPDATE {runs} SET due_at = {now}, updated_at = {now} WHERE id = ? AND {overdue}",
            ),
            redispatch_queued: render(
                "UPDATE {runs} SET due_at = {now}, updated_at = {now} WHERE id = ? AND status = 'queued'",
            ),
            dead_letter_stale: render(
                "UPDATE {runs} SET status = 'failed', termination_reason = ?, lease_expires = 0, \
                 finished_at = {now}, updated_at = {now} WHERE id = ? AND {stale}",
            ),
            settle_owned: render(
                "UPDATE {runs} SET status = ?, termination_reason = ?, error_class = ?, output = COALESCE(?, output), \
                 lease_expires = 0, finished_at = CASE WHEN ? = 1 THEN {now} ELSE finished_at END, updated_at = {now} \
                 WHERE id = ? AND status IN {nonterminal} AND claimed_by = ?",
            ),
            settle_interactive: render(
                "UPDATE {runs} SET status = ?, termination_reason = ?, error_class = ?, output = COALESCE(?, output), \
                 lease_expires = 0, finished_at = CASE WHEN ? = 1 THEN {now} ELSE finished_at END, updated_at = {now} \
                 WHERE id = ? AND status IN {nonterminal} AND claimed_by IS NULL",
            ),
            fail_queued: render(
                "UPDATE {runs} SET status = 'failed', termination_reason = ?, lease_expires = 0, \
                 unique_key = NULL, finished_at = {now}, updated_at = {now} WHERE id = ? AND status = 'queued'",
            ),
            resume: render(
                "UPDATE {runs} SET status = 'running', claimed_by = NULL, lease_expires = 0, updated_at = {now} \
                 WHERE id = ? AND status = ?",
            ),
            cancel: render(
                "UPDATE {runs} SET status = 'cancelled', termination_reason = 'cancelled', lease_expires = 0, \
                 finished_at = {now}, updated_at = {now} WHERE id = ? AND status IN {nonterminal}",
            ),
            effect_owned: render(
                "UPDATE {runs} SET pending_effect = ?, updated_at = {now} \
                 WHERE id = ? AND status = 'running' AND claimed_by = ?",
            ),
            effect_interactive: render(
                "UPDATE {runs} SET pending_effect = ?, updated_at = {now} \
                 WHERE id = ? AND status = 'running' AND claimed_by IS NULL",
            ),
            append_event: render(
                "INSERT INTO {events} (run_id, seq, kind, payload, created_at) \
                 SELECT ?, COALESCE(MAX(seq), 0) + 1, ?, ?, {now} FROM {events} WHERE run_id = ?{returning_seq}",
            ),
            max_seq: render("SELECT COALESCE(MAX(seq), 0) AS seq FROM {events} WHERE run_id = ?"),
            events: render(
                "SELECT run_id, seq, kind, payload, created_at FROM {events} WHERE run_id = ? ORDER BY seq",
            ),
        }
    }
}
