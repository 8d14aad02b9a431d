//! The token ledger: the sums of model-call tokens an operator reads and a
//! quota checks, kept as each call's usage is charged (never recounted
//! from the calls on read).
//!
//! A call's usage is charged once, in the transaction that records the
//! call's result ([`charge`]): to its tenant's day record, on the line of
//! its project, agent and release, and to its run and every run above it
//! (a delegated child's tokens are its supervisor's too). Per attempt the
//! sum is the attempt's own (`usage.tokens`). Today's sums per tenant and
//! project are mirrored in the quota book for `tokensPerDay`.

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::access::TenantScope;
use crate::domain::usage::TokenUsage;
use crate::domain::{ProjectId, TenantId};
use crate::store::{Record, Store, StoreError, Table, Tx};

/// One tenant's tokens on one UTC day, by project, agent and release.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenDay {
    /// The tenant.
    pub tenant_id: TenantId,
    /// The UTC day.
    pub day: NaiveDate,
    /// One line per project, agent and release that made model calls.
    pub lines: Vec<TokenLine>,
    /// Last charge.
    pub updated_at: DateTime<Utc>,
}

/// The tokens of one project, agent and release on one day.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenLine {
    /// The project.
    pub project_id: ProjectId,
    /// The agent.
    pub agent_id: String,
    /// The release.
    pub release_id: String,
    /// The sums.
    pub usage: TokenUsage,
}

impl Record for TokenDay {
    const TABLE: Table = Table::TokenDays;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.day.to_string()
    }
}

/// One run's tokens: its own attempts', and with every run it delegated
/// to (and they to theirs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunTokens {
    /// The tenant.
    #[schema(value_type = String)]
    pub tenant_id: TenantId,
    /// The run.
    pub run_id: Uuid,
    /// Its own attempts' model calls.
    pub own: TokenUsage,
    /// Its own and its child runs' model calls.
    pub with_children: TokenUsage,
}

impl RunTokens {
    /// A run that has charged nothing yet.
    pub fn none(tenant: &TenantId, run_id: Uuid) -> RunTokens {
        RunTokens {
            tenant_id: tenant.clone(),
            run_id,
            own: TokenUsage::default(),
            with_children: TokenUsage::default(),
        }
    }
}

impl Record for RunTokens {
    const TABLE: Table = Table::RunTokens;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.run_id.to_string()
    }
}

/// One model call's usage, with what it is charged to.
#[derive(Clone, Debug)]
pub struct Charge<'a> {
    /// The project.
    pub project_id: &'a ProjectId,
    /// The agent.
    pub agent_id: &'a str,
    /// The release.
    pub release_id: &'a str,
    /// The run of the attempt that made the call.
    pub run_id: Uuid,
    /// The runs above it, nearest first.
    pub ancestors: &'a [Uuid],
    /// What the call used.
    pub usage: TokenUsage,
    /// When its result was recorded: the day it is charged to.
    pub at: DateTime<Utc>,
}

/// Charges one call's usage, inside the transaction that records the
/// call's result.
pub fn charge(tx: &mut Tx, scope: &TenantScope, c: &Charge<'_>) -> Result<(), StoreError> {
    let day = c.at.date_naive();
    let mut record = tx
        .get::<TokenDay>(scope, &day.to_string())?
        .unwrap_or_else(|| TokenDay {
            tenant_id: scope.tenant().clone(),
            day,
            lines: Vec::new(),
            updated_at: c.at,
        });
    match record.lines.iter_mut().find(|l| {
        l.project_id == *c.project_id && l.agent_id == c.agent_id && l.release_id == c.release_id
    }) {
        Some(line) => line.usage.add(&c.usage),
        None => record.lines.push(TokenLine {
            project_id: c.project_id.clone(),
            agent_id: c.agent_id.to_string(),
            release_id: c.release_id.to_string(),
            usage: c.usage,
        }),
    }
    record.updated_at = c.at;
    tx.put(scope, &record)?;
    for (i, run_id) in std::iter::once(c.run_id)
        .chain(c.ancestors.iter().copied())
        .enumerate()
    {
        let mut sums = tx
            .get::<RunTokens>(scope, &run_id.to_string())?
            .unwrap_or_else(|| RunTokens::none(scope.tenant(), run_id));
        if i == 0 {
            sums.own.add(&c.usage);
        }
        sums.with_children.add(&c.usage);
        tx.put(scope, &sums)?;
    }
    Ok(())
}

/// A run's tokens (nothing yet: zero).
pub fn run_tokens(
    store: &Store,
    scope: &TenantScope,
    run_id: Uuid,
) -> Result<RunTokens, StoreError> {
    Ok(store
        .get::<RunTokens>(scope, &run_id.to_string())?
        .unwrap_or_else(|| RunTokens::none(scope.tenant(), run_id)))
}

/// A tenant's day records from `from` to `to` (inclusive), oldest first.
pub fn days(
    store: &Store,
    scope: &TenantScope,
    from: NaiveDate,
    to: NaiveDate,
) -> Result<Vec<TokenDay>, StoreError> {
    let mut out: Vec<TokenDay> = store
        .list_under::<TokenDay>(scope, "")?
        .into_iter()
        .filter(|d| d.day >= from && d.day <= to)
        .collect();
    out.sort_by_key(|d| d.day);
    Ok(out)
}

/// What a usage report groups by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grouping {
    /// One row per UTC day.
    pub day: bool,
    /// Per project.
    pub project: bool,
    /// Per agent.
    pub agent: bool,
    /// Per release.
    pub release: bool,
}

impl Grouping {
    /// The grouping names, in the order rows are keyed.
    pub const NAMES: [&'static str; 4] = ["day", "project", "agent", "release"];

    /// Parses `day,project,...` (the field is named for the error).
    pub fn parse(field: &str, text: &str) -> Result<Grouping, crate::domain::FieldError> {
        let mut g = Grouping::default();
        if text.is_empty() {
            return Ok(g);
        }
        for name in text.split(',') {
            match name {
                "day" => g.day = true,
                "project" => g.project = true,
                "agent" => g.agent = true,
                "release" => g.release = true,
                other => {
                    return Err(crate::domain::FieldError::new(
                        field,
                        format!(
                            "{other:?} is not a grouping; use any of {}",
                            Grouping::NAMES.join(", ")
                        ),
                    ));
                }
            }
        }
        Ok(g)
    }
}

/// Which lines a usage report counts.
#[derive(Clone, Debug, Default)]
pub struct UsageFilter {
    /// Only this project.
    pub project_id: Option<String>,
    /// Only this agent.
    pub agent_id: Option<String>,
}

/// One row of a usage report: the sums of the lines its key admits.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageRow {
    /// The UTC day (grouped by day).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day: Option<NaiveDate>,
    /// The project (grouped by project).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub project_id: Option<ProjectId>,
    /// The agent (grouped by agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The release (grouped by release).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_id: Option<String>,
    /// The sums.
    pub usage: TokenUsage,
    /// Input and output tokens.
    pub total_tokens: u64,
}

/// Groups the lines of `days` as `by` says, counting those `filter`
/// admits; rows in key order, and the total of them all.
pub fn report(
    days: &[TokenDay],
    by: Grouping,
    filter: &UsageFilter,
) -> (Vec<UsageRow>, TokenUsage) {
    type Key = (
        Option<NaiveDate>,
        Option<ProjectId>,
        Option<String>,
        Option<String>,
    );
    let mut rows: std::collections::BTreeMap<Key, TokenUsage> = Default::default();
    let mut total = TokenUsage::default();
    for day in days {
        for line in &day.lines {
            if filter
                .project_id
                .as_ref()
                .is_some_and(|p| p != line.project_id.as_str())
                || filter
                    .agent_id
                    .as_ref()
                    .is_some_and(|a| *a != line.agent_id)
            {
                continue;
            }
            let key = (
                by.day.then_some(day.day),
                by.project.then(|| line.project_id.clone()),
                by.agent.then(|| line.agent_id.clone()),
                by.release.then(|| line.release_id.clone()),
            );
            rows.entry(key).or_default().add(&line.usage);
            total.add(&line.usage);
        }
    }
    let rows = rows
        .into_iter()
        .map(
            |((day, project_id, agent_id, release_id), usage)| UsageRow {
                day,
                project_id,
                agent_id,
                release_id,
                total_tokens: usage.total(),
                usage,
            },
        )
        .collect();
    (rows, total)
}

/// A report as CSV: one header line, one line per row, the grouped
/// columns first.
pub fn csv(rows: &[UsageRow], by: Grouping) -> String {
    let mut header: Vec<&str> = Vec::new();
    for (on, name) in [
        (by.day, "day"),
        (by.project, "projectId"),
        (by.agent, "agentId"),
        (by.release, "releaseId"),
    ] {
        if on {
            header.push(name);
        }
    }
    header.extend([
        "inputTokens",
        "outputTokens",
        "cachedTokens",
        "totalTokens",
        "modelCalls",
    ]);
    let mut out = crate::domain::csv::line(&header);
    out.push('\n');
    for r in rows {
        let mut cells: Vec<String> = Vec::new();
        if by.day {
            cells.push(r.day.map(|d| d.to_string()).unwrap_or_default());
        }
        if by.project {
            cells.push(
                r.project_id
                    .as_ref()
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
            );
        }
        if by.agent {
            cells.push(r.agent_id.clone().unwrap_or_default());
        }
        if by.release {
            cells.push(r.release_id.clone().unwrap_or_default());
        }
        cells.extend(
            [
                r.usage.input_tokens,
                r.usage.output_tokens,
                r.usage.cached_tokens,
                r.total_tokens,
                r.usage.model_calls,
            ]
            .map(|n| n.to_string()),
        );
        out.push_str(&crate::domain::csv::line(&cells));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(project: &str, agent: &str, release: &str, input: u64, output: u64) -> TokenLine {
        TokenLine {
            project_id: ProjectId::parse(project).unwrap(),
            agent_id: agent.into(),
            release_id: release.into(),
            usage: TokenUsage::call(input, output, 0),
        }
    }

    #[test]
    fn a_report_groups_and_filters_the_day_lines_and_writes_csv() {
        let t = TenantId::parse("acme").unwrap();
        let day = |d: u32, lines| TokenDay {
            tenant_id: t.clone(),
            day: NaiveDate::from_ymd_opt(2026, 12, d).unwrap(),
            lines,
            updated_at: Utc::now(),
        };
        let days = vec![
            day(
                1,
                vec![
                    line("web", "triage", "t-1", 10, 5),
                    line("ops", "triage", "t-1", 7, 1),
                ],
            ),
            day(
                2,
                vec![
                    line("web", "triage", "t-2", 20, 2),
                    line("web", "helper", "h-1", 3, 3),
                ],
            ),
        ];
        let by_day = Grouping::parse("groupBy", "day").unwrap();
        let (rows, total) = report(&days, by_day, &UsageFilter::default());
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].total_tokens, 23);
        assert_eq!(rows[1].total_tokens, 28);
        assert_eq!(total.total(), 51);
        assert_eq!(total.model_calls, 4);
        let by = Grouping::parse("groupBy", "project,agent").unwrap();
        let web = UsageFilter {
            project_id: Some("web".into()),
            agent_id: None,
        };
        let (rows, total) = report(&days, by, &web);
        assert_eq!(
            rows.iter()
                .map(|r| (r.agent_id.clone().unwrap(), r.total_tokens))
                .collect::<Vec<_>>(),
            vec![("helper".to_string(), 6), ("triage".to_string(), 37)]
        );
        assert_eq!(total.total(), 43);
        assert_eq!(
            csv(&rows, by),
            "projectId,agentId,inputTokens,outputTokens,cachedTokens,totalTokens,modelCalls\n\
             web,helper,3,3,0,6,1\nweb,triage,30,7,0,37,2\n"
        );
        let err = Grouping::parse("groupBy", "day,week").unwrap_err();
        assert_eq!(err.field, "groupBy");
        assert!(err.reason.contains("\"week\""), "{}", err.reason);
    }
}

/// A usage report's question: which days, grouped how, of what.
#[derive(Clone, Debug)]
pub struct UsageQuery {
    /// First UTC day.
    pub from: NaiveDate,
    /// Last UTC day (inclusive).
    pub to: NaiveDate,
    /// Grouping.
    pub by: Grouping,
    /// Filters.
    pub filter: UsageFilter,
}

/// Longest range a report covers, in days.
pub const MAX_REPORT_DAYS: i64 = 366;

impl UsageQuery {
    /// Reads a query's fields (empty: the default), naming the field that
    /// is wrong. The default range is the 30 days up to `today`.
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        group_by: &str,
        project_id: Option<&str>,
        agent_id: Option<&str>,
        today: NaiveDate,
    ) -> Result<UsageQuery, crate::domain::FieldError> {
        use crate::domain::FieldError;
        let day = |field: &str, text: Option<&str>, default: NaiveDate| {
            let Some(text) = text else {
                return Ok(default);
            };
            FieldError::parse_day(field, text)
        };
        let to = day("to", to, today)?;
        // A range longer than a report covers is cut to its last days; the
        // report says which days it covers. From after to: no day.
        let from = day("from", from, to - chrono::Duration::days(29))?
            .max(to - chrono::Duration::days(MAX_REPORT_DAYS - 1));
        let mut by = Grouping::parse("groupBy", group_by)?;
        if by == Grouping::default() {
            by.day = true;
        }
        Ok(UsageQuery {
            from,
            to,
            by,
            filter: UsageFilter {
                project_id: project_id
                    .map(|p| ProjectId::parse_field("projectId", p).map(|p| p.to_string()))
                    .transpose()?,
                agent_id: agent_id
                    .map(|a| {
                        crate::domain::release::check_name("agentId", a)?;
                        Ok::<_, FieldError>(a.to_string())
                    })
                    .transpose()?,
            },
        })
    }
}

/// A usage report.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// The tenant.
    #[schema(value_type = String)]
    pub tenant_id: TenantId,
    /// First UTC day.
    pub from: NaiveDate,
    /// Last UTC day.
    pub to: NaiveDate,
    /// What the rows are grouped by.
    pub group_by: Vec<&'static str>,
    /// One per group, in key order.
    pub rows: Vec<UsageRow>,
    /// All rows together.
    pub total: TokenUsage,
}

/// Answers `query` for a tenant from its day records.
pub fn usage(
    store: &Store,
    scope: &TenantScope,
    query: &UsageQuery,
) -> Result<UsageReport, StoreError> {
    let days = days(store, scope, query.from, query.to)?;
    let (rows, total) = report(&days, query.by, &query.filter);
    let by = query.by;
    Ok(UsageReport {
        tenant_id: scope.tenant().clone(),
        from: query.from,
        to: query.to,
        group_by: [by.day, by.project, by.agent, by.release]
            .into_iter()
            .zip(Grouping::NAMES)
            .filter_map(|(on, name)| on.then_some(name))
            .collect(),
        rows,
        total,
    })
}
