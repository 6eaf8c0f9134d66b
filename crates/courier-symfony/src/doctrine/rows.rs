//! The rows of a multi-row insert on SQLite and MariaDB: the statement and its values.

/// The values [`insert_values`] binds, row by row.
pub(crate) fn row_values<'a>(
    rows: &'a [(String, String, String)],
    queue: &'a str,
    created: &'a str,
) -> impl Iterator<Item = &'a str> {
    rows.iter().flat_map(move |(body, headers, available)| {
        [body.as_str(), headers, queue, created, available]
    })
}

/// The `VALUES` of a multi-row insert of `n` rows of five anonymous `?`s (SQLite and MariaDB:
/// sqlx asks SQLite each numbered parameter's name, which SQLite finds by scanning the
/// statement's list of named ones, `?NNN`, hundreds per batch).
pub(crate) fn insert_values(t: &str, n: usize) -> String {
    let values = vec!["(?, ?, ?, ?, ?)"; n].join(", ");
    format!("INSERT INTO {t} (body, headers, queue_name, created_at, available_at) VALUES {values}")
}
