//! Tables that sort, filter and page on the server, so they work without
//! JavaScript: the state is in the query string (`sort`, `dir`, `q`, `page`
//! plus each page's own filters) and every header and pager link keeps the
//! rest of it.

use axum::extract::RawQuery;

/// Rows per page.
pub const PAGE_SIZE: usize = 50;

/// One cell.
pub enum Cell {
    /// Plain text.
    Text(String),
    /// Monospace text with its full value in the title.
    Code {
        /// Shown.
        text: String,
        /// Full value.
        full: String,
    },
    /// A link.
    Link {
        /// Shown.
        text: String,
        /// Target.
        href: String,
        /// The whole value, on hover (empty: the text is whole).
        title: String,
    },
    /// A time: the exact UTC time without JavaScript; how long ago (or
    /// ahead) with it, the exact time on hover. `text` is `when`'s form,
    /// which sorts as time does; empty when there is none.
    Time {
        /// RFC 3339, for the `datetime` attribute.
        at: String,
        /// `YYYY-MM-DD HH:MM:SS UTC`.
        text: String,
    },
    /// Words that name things by id: each id (a UUID, a `sha256:` hash)
    /// is shown short, whole on hover and copied whole ([`Cell::words`]).
    Words {
        /// The whole text, for sorting and filtering.
        text: String,
        /// Its pieces: text, or an id (true).
        parts: Vec<(String, bool)>,
    },
    /// A state, shown as a badge coloured by its meaning.
    State(String),
    /// A number, right-aligned and sorted numerically.
    Num(f64, String),
    /// Buttons that post small forms.
    Actions(Vec<Action>),
    /// The form that settles an uncertain call, posting to the URL: the
    /// effect, what was checked, and whether to try again.
    Settle(String),
    /// A box that picks the row for a bulk action of the form `form`
    /// (outside the table), under the field `name`.
    Pick {
        /// The form's id.
        form: &'static str,
        /// The field.
        name: &'static str,
        /// What a picked row sends.
        value: String,
    },
}

impl Cell {
    /// Text cell.
    pub fn text(s: impl Into<String>) -> Cell {
        Cell::Text(s.into())
    }

    /// A cell of words whose ids are shown short.
    pub fn words(text: impl Into<String>) -> Cell {
        let text = text.into();
        Cell::Words {
            parts: split_ids(&text),
            text,
        }
    }

    /// A time cell.
    pub fn time(t: &chrono::DateTime<chrono::Utc>) -> Cell {
        Cell::Time {
            at: t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            text: super::when(t),
        }
    }

    /// A time cell, empty when there is no time.
    pub fn time_opt(t: &Option<chrono::DateTime<chrono::Utc>>) -> Cell {
        match t {
            Some(t) => Cell::time(t),
            None => Cell::Text(String::new()),
        }
    }

    /// Monospace cell, shortened.
    pub fn code(s: impl Into<String>) -> Cell {
        let full = s.into();
        Cell::Code {
            text: super::short(&full),
            full,
        }
    }

    /// Link cell.
    pub fn link(text: impl Into<String>, href: impl Into<String>) -> Cell {
        Cell::Link {
            text: text.into(),
            href: href.into(),
            title: String::new(),
        }
    }

    /// A link to an object by its id: the part that tells ids apart is
    /// shown ([`super::short`]), the whole id is on hover and in the filter.
    pub fn id(id: impl ToString, href: impl Into<String>) -> Cell {
        let title = id.to_string();
        Cell::Link {
            text: super::short(&title),
            href: href.into(),
            title,
        }
    }

    /// Number cell.
    pub fn num(n: impl Into<f64> + Copy + ToString) -> Cell {
        Cell::Num(n.into(), n.to_string())
    }

    fn sort_key(&self) -> SortKey<'_> {
        match self {
            Cell::Num(n, _) => SortKey::Num(*n),
            Cell::Text(s)
            | Cell::State(s)
            | Cell::Time { text: s, .. }
            | Cell::Words { text: s, .. } => SortKey::Text(s),
            Cell::Code { full, .. } => SortKey::Text(full),
            Cell::Link { text, .. } => SortKey::Text(text),
            Cell::Actions(_) | Cell::Settle(_) | Cell::Pick { .. } => SortKey::Text(""),
        }
    }

    fn matches(&self, needle: &str) -> bool {
        let hay = match self {
            Cell::Text(s)
            | Cell::State(s)
            | Cell::Time { text: s, .. }
            | Cell::Words { text: s, .. } => s,
            Cell::Code { full, .. } => full,
            Cell::Link { text, title, .. } if !title.is_empty() => {
                return title.to_lowercase().contains(needle)
                    || text.to_lowercase().contains(needle);
            }
            Cell::Link { text, .. } => text,
            Cell::Num(_, s) => s,
            Cell::Actions(_) | Cell::Settle(_) | Cell::Pick { .. } => return false,
        };
        hay.to_lowercase().contains(needle)
    }

    /// CSS class of a state badge.
    pub fn tone(state: &str) -> &'static str {
        match state {
            "Succeeded" | "Active" | "Granted" | "verified" | "approved" | "answered"
            | "completed" | "active" | "Published" => "ok",
            "Failed" | "TimedOut" | "Denied" | "rejected" | "failed" | "revoked" | "Expired"
            | "expired" | "Revoked" | "disabled" | "Disabled" => "bad",
            "Uncertain" | "uncertain" | "WaitingForDecision" | "pending" | "Requested"
            | "Paused" | "Draining" | "Deprecated" => "warn",
            _ => "",
        }
    }
}

/// The text's ids (UUIDs in their hyphenated form, `sha256:` and 64 hex
/// digits) apart from its words, in order: (piece, is an id).
pub fn split_ids(text: &str) -> Vec<(String, bool)> {
    fn id_at(s: &str) -> Option<usize> {
        let b = s.as_bytes();
        let hex = |r: std::ops::Range<usize>| {
            r.clone()
                .all(|i| b.get(i).is_some_and(u8::is_ascii_hexdigit))
        };
        if s.starts_with("sha256:")
            && hex(7..71)
            && !b.get(71).is_some_and(u8::is_ascii_alphanumeric)
        {
            return Some(71);
        }
        let dashes = [8, 13, 18, 23];
        let uuid = (0..36).all(|i| {
            if dashes.contains(&i) {
                b.get(i) == Some(&b'-')
            } else {
                b.get(i).is_some_and(u8::is_ascii_hexdigit)
            }
        });
        (uuid && !b.get(36).is_some_and(u8::is_ascii_alphanumeric)).then_some(36)
    }
    let mut parts: Vec<(String, bool)> = Vec::new();
    let mut words = String::new();
    let mut i = 0;
    while i < text.len() {
        let boundary = i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric();
        if boundary && let Some(n) = id_at(&text[i..]) {
            if !words.is_empty() {
                parts.push((std::mem::take(&mut words), false));
            }
            parts.push((text[i..i + n].to_string(), true));
            i += n;
            continue;
        }
        let c = text[i..].chars().next().expect("within the text");
        words.push(c);
        i += c.len_utf8();
    }
    if !words.is_empty() {
        parts.push((words, false));
    }
    parts
}

#[derive(PartialEq, PartialOrd)]
enum SortKey<'a> {
    Num(f64),
    Text(&'a str),
}

/// A button that posts a small form.
pub struct Action {
    /// Where it posts.
    pub href: String,
    /// Its label.
    pub label: String,
    /// Hidden fields besides the CSRF token.
    pub fields: Vec<(String, String)>,
    /// A reason the action needs, asked in a text field of the form (its
    /// prompt), sent as `reason`.
    pub ask: Option<&'static str>,
    /// Whether it destroys or stops something.
    pub danger: bool,
}

/// A column.
pub struct Column {
    /// Header text.
    pub label: &'static str,
    /// Link that sorts by it.
    pub href: String,
    /// ▲ or ▼ when sorted by it.
    pub arrow: &'static str,
}

/// A filter of the table's filter bar.
pub struct Filter {
    /// Query key.
    pub name: &'static str,
    /// Label.
    pub label: &'static str,
    /// Choices (value, label); empty for a text input.
    pub options: Vec<(String, String)>,
    /// The current value.
    pub value: String,
    /// The input's type without choices: `text` or `date`.
    pub input: &'static str,
}

/// A rendered table: the rows of one page, sorted and filtered.
pub struct Table {
    /// Element id.
    pub id: &'static str,
    /// Columns.
    pub columns: Vec<Column>,
    /// The rows of this page.
    pub rows: Vec<Vec<Cell>>,
    /// What the count says, e.g. "12 shown" or "50 of 1,204, newest first".
    pub count: String,
    /// Where the page is, e.g. "page 2 of 3"; empty on a single page.
    pub position: String,
    /// Link to the previous page.
    pub prev: Option<String>,
    /// Link to the next page.
    pub next: Option<String>,
    /// Filters of the filter bar (without the free-text one).
    pub filters: Vec<Filter>,
    /// The free-text filter.
    pub q: String,
    /// The page's path.
    pub path: String,
    /// What an empty table says.
    pub empty: &'static str,
}

impl Table {
    /// Whether the pager counts pages (else it walks a history by cursor).
    pub fn page_numbers(&self) -> bool {
        self.position.starts_with("page")
    }
}

/// The query string of a list page.
pub struct ListQuery {
    pairs: Vec<(String, String)>,
}

impl ListQuery {
    /// Parses the query string; a malformed one counts as empty.
    pub fn parse(raw: &RawQuery) -> ListQuery {
        ListQuery {
            pairs: serde_urlencoded::from_str(raw.0.as_deref().unwrap_or("")).unwrap_or_default(),
        }
    }

    /// A value, trimmed; `None` when blank.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    fn link(&self, path: &str, set: &[(&str, String)]) -> String {
        let mut pairs: Vec<(String, String)> = self
            .pairs
            .iter()
            .filter(|(k, v)| !v.is_empty() && !set.iter().any(|(s, _)| s == k))
            .cloned()
            .collect();
        pairs.extend(set.iter().map(|(k, v)| (k.to_string(), v.clone())));
        match serde_urlencoded::to_string(&pairs) {
            Ok(q) if !q.is_empty() => format!("{path}?{q}"),
            _ => path.to_string(),
        }
    }

    /// A filter of the bar with its current value.
    pub fn filter(&self, name: &'static str, label: &'static str, options: Vec<String>) -> Filter {
        Filter {
            name,
            label,
            options: options.into_iter().map(|o| (o.clone(), o)).collect(),
            value: self.get(name).unwrap_or_default().to_string(),
            input: "text",
        }
    }

    /// A filter by a UTC day (`YYYY-MM-DD`, a date input).
    pub fn day_filter(&self, name: &'static str, label: &'static str) -> Filter {
        Filter {
            input: "date",
            ..self.filter(name, label, Vec::new())
        }
    }

    /// The day a `day_filter` holds, or the error naming it.
    pub fn day(&self, name: &str) -> Result<Option<chrono::NaiveDate>, crate::domain::FieldError> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .map(|v| crate::domain::FieldError::parse_day(name, v))
            .transpose()
    }

    /// Sorts, filters and pages `rows` under `labels`. Without a `sort`
    /// parameter the rows keep their given order.
    pub fn table(
        &self,
        id: &'static str,
        path: &str,
        labels: &[&'static str],
        mut rows: Vec<Vec<Cell>>,
        filters: Vec<Filter>,
        empty: &'static str,
    ) -> Table {
        let (sort, desc) = self.filter_and_sort(labels, &mut rows);
        let total = rows.len();
        let pages = total.div_ceil(PAGE_SIZE).max(1);
        let page = self
            .get("page")
            .and_then(|p| p.parse::<usize>().ok())
            .unwrap_or(1)
            .clamp(1, pages);
        let rows: Vec<Vec<Cell>> = rows
            .into_iter()
            .skip((page - 1) * PAGE_SIZE)
            .take(PAGE_SIZE)
            .collect();
        let columns = self.columns(path, labels, sort, desc);
        let page_link = |p: usize| self.link(path, &[("page", p.to_string())]);
        Table {
            id,
            columns,
            rows,
            count: match pages {
                1 => format!("{total} shown"),
                _ => format!("{total} shown · page {page} of {pages}"),
            },
            position: if pages > 1 {
                format!("page {page} of {pages}")
            } else {
                String::new()
            },
            prev: (page > 1).then(|| page_link(page - 1)),
            next: (page < pages).then(|| page_link(page + 1)),
            filters,
            q: self.get("q").unwrap_or_default().to_string(),
            path: path.to_string(),
            empty,
        }
    }

    /// A page of a history too long to hold at once: `rows` are one page,
    /// newest first, read through an index from the `before` cursor of the
    /// query; `older` is the cursor of the next page, `total` how many
    /// records the filter has in all when known. Sorting and the free-text
    /// filter apply within the page.
    #[allow(clippy::too_many_arguments)]
    pub fn history_table(
        &self,
        id: &'static str,
        path: &str,
        labels: &[&'static str],
        mut rows: Vec<Vec<Cell>>,
        filters: Vec<Filter>,
        empty: &'static str,
        total: Option<u64>,
        older: Option<String>,
    ) -> Table {
        let (sort, desc) = self.filter_and_sort(labels, &mut rows);
        let shown = rows.len();
        let first = self.get("before").is_none();
        let count = match (total, first && older.is_none()) {
            (_, true) => format!("{shown} shown"),
            (Some(t), false) => format!("{shown} shown of {t}, newest first"),
            (None, false) => format!("{shown} shown, newest first"),
        };
        Table {
            id,
            columns: self.columns(path, labels, sort, desc),
            rows,
            count,
            position: if first && older.is_none() {
                String::new()
            } else if first {
                "newest".into()
            } else {
                "older".into()
            },
            prev: (!first).then(|| self.link(path, &[("before", String::new())])),
            next: older.map(|o| self.link(path, &[("before", o)])),
            filters,
            q: self.get("q").unwrap_or_default().to_string(),
            path: path.to_string(),
            empty,
        }
    }

    /// Applies the free-text filter `q` and the `sort`/`dir` of the query
    /// to `rows`; returns the sorted column and whether it is descending.
    fn filter_and_sort(
        &self,
        labels: &[&'static str],
        rows: &mut Vec<Vec<Cell>>,
    ) -> (Option<usize>, bool) {
        let q = self.get("q").unwrap_or_default().to_lowercase();
        if !q.is_empty() {
            rows.retain(|row| row.iter().any(|c| c.matches(&q)));
        }
        let sort = self
            .get("sort")
            .and_then(|s| labels.iter().position(|l| l.eq_ignore_ascii_case(s)));
        let desc = self.get("dir") == Some("desc");
        if let Some(i) = sort {
            rows.sort_by(|a, b| {
                let (x, y) = (a[i].sort_key(), b[i].sort_key());
                let o = x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal);
                if desc { o.reverse() } else { o }
            });
        }
        (sort, desc)
    }

    fn columns(
        &self,
        path: &str,
        labels: &[&'static str],
        sort: Option<usize>,
        desc: bool,
    ) -> Vec<Column> {
        labels
            .iter()
            .enumerate()
            .map(|(i, label)| {
                let this = sort == Some(i);
                let dir = if this && !desc { "desc" } else { "asc" };
                Column {
                    label,
                    href: self.link(
                        path,
                        &[
                            ("sort", label.to_lowercase()),
                            ("dir", dir.to_string()),
                            ("page", String::new()),
                        ],
                    ),
                    arrow: match (this, desc) {
                        (true, false) => " ▲",
                        (true, true) => " ▼",
                        _ => "",
                    },
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_told_apart_from_words() {
        let text =
            "waiting for decision 0190e5a0-0000-7000-8000-0000000000ff (approval x); hash sha256:"
                .to_string()
                + &"ab".repeat(32)
                + " ok";
        let parts = split_ids(&text);
        let ids: Vec<&str> = parts.iter().filter(|p| p.1).map(|p| p.0.as_str()).collect();
        assert_eq!(ids[0], "0190e5a0-0000-7000-8000-0000000000ff");
        assert_eq!(ids[1].len(), 71);
        assert_eq!(parts.iter().map(|p| p.0.as_str()).collect::<String>(), text);
        // Not an id: too short, or part of a longer word.
        assert!(
            split_ids("0190e5a0-0000 x0190e5a0-0000-7000-8000-0000000000ff")
                .iter()
                .all(|p| !p.1)
        );
    }

    fn query(q: &str) -> ListQuery {
        ListQuery::parse(&RawQuery(Some(q.to_string())))
    }

    fn rows(n: usize) -> Vec<Vec<Cell>> {
        (0..n)
            .map(|i| {
                vec![
                    Cell::text(format!("row-{i:03}")),
                    Cell::num(i as u32),
                    Cell::State(if i % 2 == 0 { "Running" } else { "Failed" }.into()),
                ]
            })
            .collect()
    }

    #[test]
    fn tables_sort_filter_and_page() {
        let t = query("sort=n&dir=desc&state=x").table(
            "t",
            "/x",
            &["Name", "N", "State"],
            rows(120),
            vec![],
            "",
        );
        assert_eq!(t.count, "120 shown · page 1 of 3");
        assert!(matches!(&t.rows[0][1], Cell::Num(n, _) if *n == 119.0));
        assert_eq!(t.columns[1].arrow, " ▼");
        assert!(
            t.columns[1].href.contains("dir=asc"),
            "{}",
            t.columns[1].href
        );
        assert!(
            t.columns[1].href.contains("state=x"),
            "other filters are kept"
        );
        assert_eq!(t.next.as_deref(), Some("/x?sort=n&dir=desc&state=x&page=2"));
        assert!(t.prev.is_none());

        let t = query("q=FAILED&page=9").table(
            "t",
            "/x",
            &["Name", "N", "State"],
            rows(120),
            vec![],
            "",
        );
        assert_eq!(
            t.count, "60 shown · page 2 of 2",
            "filtered, and the page clamped"
        );
        assert!(t.next.is_none());
    }
}
