//! Plain text tables that fit an 80-column terminal.

/// A table of left-aligned text columns; numbers are right-aligned.
#[derive(Debug, Default)]
pub(crate) struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    /// The columns shortened (with `…`), in this order, when the table is too wide.
    flexible: Vec<usize>,
}

/// The width tables are made to fit.
pub(crate) const WIDTH: usize = 80;

impl Table {
    /// A table with these column headers.
    pub(crate) fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            ..Self::default()
        }
    }

    /// Shortens column `index` first when the table is too wide.
    pub(crate) fn flexible(mut self, index: usize) -> Self {
        self.flexible.push(index);
        self
    }

    /// Adds a row.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines of text.
    pub(crate) fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut total: usize = widths.iter().sum::<usize>() + 2 * columns.saturating_sub(1);
        for &f in self.flexible.iter().filter(|f| **f < columns) {
            if total <= WIDTH {
                break;
            }
            let floor = self.headers[f].chars().count().max(8);
            let cut = (total - WIDTH).min(widths[f].saturating_sub(floor));
            widths[f] -= cut;
            total -= cut;
        }
        let numeric: Vec<bool> = (0..columns)
            .map(|i| {
                !self.rows.is_empty()
                    && self
                        .rows
                        .iter()
                        .all(|r| r.get(i).is_some_and(|c| is_number(c)))
            })
            .collect();
        let mut out = String::new();
        let mut line = |cells: &[String]| {
            let mut text = String::new();
            for (i, width) in widths.iter().enumerate() {
                let cell = cells.get(i).map_or("", String::as_str);
                let cell = shorten(cell, *width);
                if i > 0 {
                    text.push_str("  ");
                }
                if numeric[i] {
                    text.push_str(&format!("{cell:>width$}"));
                } else {
                    text.push_str(&format!("{cell:<width$}"));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(&self.headers);
        for row in &self.rows {
            line(row);
        }
        out
    }
}

fn is_number(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == ',' || c == '-')
}

/// Cuts `s` to `width` characters, ending with `…` when cut.
pub(crate) fn shorten(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_tables_shrink_their_flexible_column_to_80_columns() {
        let mut t = Table::new(&["ID", "ERROR"]).flexible(1);
        t.row(vec!["1".into(), "x".repeat(200)]);
        assert!(t.render().lines().all(|l| l.chars().count() <= WIDTH));
    }
}
