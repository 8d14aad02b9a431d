//! Administration pages: releases (deprecate, revoke), tenants and projects,
//! users and client credentials.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Multipart, Path, RawForm, RawQuery};
use axum::response::{IntoResponse, Response};

use super::table::{Action, Cell, ListQuery, Table};
use super::{Console, Layout, ListPage, PageError, render, when};
use crate::api::error::ApiError;
use crate::auth::{clients, users};
use crate::domain::access::{Role, Scope, parse_scopes};
use crate::domain::audit::AuditQuery;
use crate::domain::release::{InFlightPolicy, LoadState, parse_release_id};
use crate::domain::tenant::TenantSpec;
use crate::domain::user::parse_roles;
use crate::domain::{FieldError, ProjectId, TenantId};

// ---- releases ---------------------------------------------------------------

/// `GET /releases`: verified and rejected releases with the reason; an
/// AssetsAdmin deprecates or revokes.
pub async fn releases(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::AssetsRead)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    let can_retire = console.can(Scope::AssetsAdmin);
    let mut list = console.state.releases.list(Some(&scope))?;
    list.sort_by_key(|r| std::cmp::Reverse(r.imported_at));
    // The newest refused import of each release id, for the Reason of a
    // release that stayed Verified.
    let mut refused: BTreeMap<String, crate::domain::trust::ReleaseVerdict> = BTreeMap::new();
    for v in console.state.releases.refused_imports(&scope, usize::MAX)? {
        refused.entry(v.release_id.clone()).or_insert(v);
    }
    let rows = list
        .iter()
        .map(|r| {
            let reason = r.why(refused.get(&r.release_id));
            let verified = r.state == LoadState::Verified;
            let lifecycle = format!("{:?}", r.lifecycle);
            let mut actions = Vec::new();
            if can_retire && verified && lifecycle != "Revoked" {
                let href = format!("/releases/{}/retire", r.release_id);
                if lifecycle == "Published" {
                    actions.push(Action {
                        href: href.clone(),
                        label: "Deprecate (drain)".into(),
                        fields: vec![
                            ("action".into(), "deprecate".into()),
                            ("inFlightPolicy".into(), "drain".into()),
                        ],
                        danger: false,
                        ask: None,
                    });
                }
                actions.push(Action {
                    href,
                    label: "Revoke (interrupt)".into(),
                    fields: vec![
                        ("action".into(), "revoke".into()),
                        ("inFlightPolicy".into(), "interrupt".into()),
                    ],
                    danger: true,
                    ask: None,
                });
            }
            vec![
                Cell::link(r.release_id.clone(), format!("/releases/{}", r.release_id)),
                Cell::text(&r.agent_id),
                Cell::text(&r.version),
                Cell::State(r.state.as_str().to_lowercase()),
                Cell::State(lifecycle),
                Cell::text(reason),
                Cell::text(r.adapter.as_str()),
                Cell::text(r.signer.clone().unwrap_or_default()),
                Cell::code(&r.manifest_hash),
                Cell::time(&r.imported_at),
                Cell::Actions(actions),
            ]
        })
        .collect();
    let t = q.table(
        "releases",
        "/releases",
        &[
            "Release",
            "Agent",
            "Version",
            "Verification",
            "Lifecycle",
            "Reason",
            "Adapter",
            "Signer",
            "Manifest",
            "Imported",
            "Actions",
        ],
        rows,
        vec![],
        "No releases imported yet: `agentbay release import BUNDLE`.",
    );
    render(&ReleasesPage {
        l: console.layout("Releases", "/releases"),
        can_import: can_retire,
        t,
    })
}

#[derive(Template)]
#[template(path = "console/releases.html")]
struct ReleasesPage {
    l: Layout,
    t: Table,
    can_import: bool,
}

/// `POST /releases/{id}/retire`: deprecate or revoke with an in-flight
/// policy.
pub async fn retire(
    console: Console,
    Path(release_id): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::AssetsAdmin)?;
    let scope = console.scope()?;
    let result = async {
        let id = parse_release_id(&release_id)?;
        let revoke = match fields.need("action")? {
            "deprecate" => false,
            "revoke" => true,
            other => {
                return Err(ApiError::invalid(
                    "action",
                    format!("{other:?} is not one of deprecate, revoke"),
                ));
            }
        };
        let policy: InFlightPolicy =
            serde_json::from_value(serde_json::json!(fields.need("inFlightPolicy")?)).map_err(
                |_| ApiError::invalid("inFlightPolicy", "is not one of finish, drain, interrupt"),
            )?;
        let (release, report) = console
            .state
            .releases
            .retire(&scope, &id, revoke, policy)
            .await?;
        Ok(format!(
            "release {} is {:?} ({policy}): {} attempt(s) of it were running, {} interrupted",
            release.release_id, release.lifecycle, report.running, report.interrupted
        ))
    }
    .await;
    // Back to the page the form was on: the list or the release's own.
    let back = match fields.get("back") {
        Some(b) if b == format!("/releases/{release_id}") => b.to_string(),
        _ => "/releases".to_string(),
    };
    Ok(console.done(&back, result))
}

/// `POST /releases`: imports a release bundle (`.tar.gz`) uploaded from
/// the Releases page, as `POST /runtime/releases` does; the answer says
/// what the import did, or which check failed.
pub async fn upload(console: Console, mut form: Multipart) -> Result<Response, PageError> {
    // Who may import, and that the form is this appliance's, are known
    // before the bundle is read: the token comes first in the form.
    console.require(Scope::AssetsAdmin)?;
    let malformed = |e: axum::extract::multipart::MultipartError| {
        PageError::bad(format!("the upload is malformed: {e}"))
    };
    let csrf = match form.next_field().await.map_err(malformed)? {
        Some(field) if field.name() == Some("csrf") => field.text().await.map_err(malformed)?,
        _ => String::new(),
    };
    console.check_csrf(&csrf)?;
    let max = console.state.config.releases.max_bundle_bytes;
    let mut bundle = None;
    while let Some(mut field) = form.next_field().await.map_err(malformed)? {
        if field.name() != Some("bundle") {
            continue;
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = field.chunk().await.map_err(malformed)? {
            if (bytes.len() + chunk.len()) as u64 > max {
                return Err(PageError::bad(format!(
                    "bundle: the file is larger than releases.max_bundle_bytes ({max} bytes)"
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        bundle = Some(bytes::Bytes::from(bytes));
    }
    let principal = console.principal().clone();
    let mut back = "/releases".to_string();
    let result = async {
        let body = bundle.filter(|b| !b.is_empty()).ok_or_else(|| {
            ApiError::invalid("bundle", "choose a release bundle (.tar.gz) to upload")
        })?;
        let (release, already) =
            crate::api::releases::import_bundle(&console.state, &principal, body).await?;
        back = format!("/releases/{}", release.release_id);
        Ok::<_, ApiError>(if already {
            format!(
                "release {} was already verified with this manifest ({}): nothing changed",
                release.release_id, release.manifest_hash
            )
        } else {
            format!(
                "release {} verified and stored (manifest {}, signed by {})",
                release.release_id,
                release.manifest_hash,
                release.signer.as_deref().unwrap_or("?")
            )
        })
    }
    .await;
    Ok(console.done(&back, result))
}

#[derive(Template)]
#[template(path = "console/release.html")]
struct ReleasePage {
    l: Layout,
    r: crate::domain::release::LoadedRelease,
    reason: String,
    verdicts: Table,
    runs: Table,
    files: Vec<(String, String)>,
    manifest: Option<String>,
    can_retire: bool,
}

/// The files a manifest pins, by path with their SHA-256: every object in
/// it that names a `path` and a `sha256`, wherever the manifest puts it.
fn pinned_files(manifest: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match manifest {
        serde_json::Value::Object(o) => {
            if let (Some(path), Some(hash)) = (
                o.get("path").and_then(|v| v.as_str()),
                o.get("sha256").and_then(|v| v.as_str()),
            ) {
                out.push((path.to_string(), hash.to_string()));
            }
            o.values().for_each(|v| pinned_files(v, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| pinned_files(v, out)),
        _ => {}
    }
}

/// `GET /releases/{id}`: a release whole: what it is, every verdict on
/// its id, the runs of it still in flight, the files it pins, its
/// manifest, and (for an AssetsAdmin) deprecate and revoke.
pub async fn release(
    console: Console,
    Path(release_id): Path<String>,
) -> Result<Response, PageError> {
    console.require(Scope::AssetsRead)?;
    let scope = console.scope()?;
    let id = parse_release_id(&release_id).map_err(ApiError::from)?;
    let releases = &console.state.releases;
    let r = releases
        .get(&scope, &id)?
        .ok_or_else(|| ApiError::from(crate::domain::DomainError::not_found("release", &id)))?;
    let history = releases.verdicts(&scope, &id)?;
    let refused = history
        .iter()
        .rev()
        .find(|v| {
            v.cause == crate::domain::trust::VerdictCause::Import && v.state != LoadState::Verified
        })
        .cloned();
    let reason = r.why(refused.as_ref());
    let verdict_rows = history
        .iter()
        .rev()
        .map(|v| {
            vec![
                Cell::time(&v.at),
                Cell::text(v.cause.as_str()),
                Cell::text(&v.by),
                Cell::State(v.state.as_str().to_lowercase()),
                Cell::text(v.reason.clone().unwrap_or_default()),
                Cell::text(&v.outcome),
                Cell::text(v.signer.clone().unwrap_or_default()),
                Cell::code(&v.manifest_hash),
            ]
        })
        .collect();
    let q = ListQuery::parse(&RawQuery(None));
    let verdicts = q.table(
        "verdicts",
        &format!("/releases/{id}"),
        &[
            "When", "Cause", "By", "Verdict", "Reason", "Outcome", "Signer", "Manifest",
        ],
        verdict_rows,
        vec![],
        "No verdict is kept for this release.",
    );
    let filter = crate::runs::RunFilter {
        release_id: Some(id.clone()),
        ..Default::default()
    };
    let in_flight: Vec<_> = console
        .state
        .runs
        .list(&scope, &filter, None, 200)?
        .into_iter()
        .filter(|run| !run.state.is_terminal())
        .collect();
    let run_rows = in_flight
        .iter()
        .map(|run| {
            vec![
                Cell::id(run.run_id, format!("/runs/{}", run.run_id)),
                Cell::State(run.state.as_str().to_string()),
                Cell::text(&run.agent_id),
                Cell::time(&run.created_at),
            ]
        })
        .collect();
    let runs = q.table(
        "in-flight",
        &format!("/releases/{id}"),
        &["Run", "State", "Agent", "Submitted"],
        run_rows,
        vec![],
        "No run of this release is in flight.",
    );
    let raw = if r.content_refs.is_empty() {
        None
    } else {
        releases
            .artifact(&scope, &r, "manifest")
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
    };
    let mut files = Vec::new();
    if let Some(m) = &raw {
        pinned_files(m, &mut files);
    }
    render(&ReleasePage {
        l: console.layout(format!("Release {id}"), "/releases"),
        reason,
        verdicts,
        runs,
        files,
        manifest: raw.map(|m| serde_json::to_string_pretty(&m).unwrap_or_default()),
        can_retire: console.can(Scope::AssetsAdmin)
            && r.state == LoadState::Verified
            && r.lifecycle != crate::domain::release::Lifecycle::Revoked,
        r,
    })
}

// ---- tenants and projects ---------------------------------------------------

#[derive(Template)]
#[template(path = "console/tenants.html")]
struct TenantsPage {
    l: Layout,
    t: Table,
    projects: Table,
    editions: Vec<String>,
    platform: bool,
    payload_default: u32,
    history_default: u32,
}

/// `GET /tenants`: tenants (PlatformAdmin) and the projects of the tenant
/// shown (its WorkspaceAdmins too).
pub async fn tenants(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::Admin)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    let platform = console.platform_admin();
    let defaults = console.state.reloader.retention.get().defaults();
    let tenants = if platform {
        console.state.capacity.tenants()
    } else {
        console
            .state
            .capacity
            .tenant(console.viewing())
            .into_iter()
            .collect()
    };
    let rows = tenants
        .iter()
        .map(|t| {
            vec![
                Cell::text(t.tenant_id.as_str()),
                Cell::text(&t.display_name),
                Cell::text(&t.edition),
                Cell::text(if t.residency_regions.is_empty() {
                    "any".to_string()
                } else {
                    t.residency_regions.join(", ")
                }),
                Cell::text(retention_text(t, defaults)),
                Cell::time(&t.created_at),
            ]
        })
        .collect();
    let t = q.table(
        "tenants",
        "/tenants",
        &[
            "Tenant",
            "Name",
            "Edition",
            "Regions",
            "Retention",
            "Registered",
        ],
        rows,
        vec![],
        "No tenants.",
    );
    let projects = console
        .state
        .capacity
        .projects(&scope)
        .map_err(ApiError::from)?
        .into_iter()
        .map(|p| {
            vec![
                Cell::text(p.project_id.as_str()),
                Cell::text(p.display_name),
                Cell::time(&p.created_at),
            ]
        })
        .collect();
    let projects = ListQuery::parse(&RawQuery(None)).table(
        "projects",
        "/tenants",
        &["Project", "Name", "Registered"],
        projects,
        vec![],
        "No projects in this tenant.",
    );
    render(&TenantsPage {
        l: console.layout("Tenants and projects", "/tenants"),
        t,
        projects,
        editions: console.state.capacity.editions(),
        platform,
        payload_default: defaults.payload_days,
        history_default: defaults.history_days,
    })
}

/// A tenant's retention in words: days, and whether they are its own.
fn retention_text(
    t: &crate::domain::tenant::Tenant,
    defaults: crate::domain::retention::Retention,
) -> String {
    let r = t.retention.resolve(defaults);
    let own = |o: Option<u32>| if o.is_some() { "" } else { " (default)" };
    format!(
        "payload {} d{} · history {} d{}",
        r.payload_days,
        own(t.retention.payload_days),
        r.history_days,
        own(t.retention.history_days)
    )
}

/// The retention fields of the tenant form: blank inherits the
/// configuration; a form without them keeps the tenant's overrides.
fn retention_fields(
    fields: &super::Fields,
) -> Result<Option<crate::domain::retention::RetentionOverride>, FieldError> {
    if !fields.has("payloadDays") && !fields.has("historyDays") {
        return Ok(None);
    }
    let days = |name: &str| -> Result<Option<u32>, FieldError> {
        match fields.get(name) {
            None => Ok(None),
            Some(v) => v
                .parse::<u32>()
                .map(Some)
                .map_err(|_| FieldError::new(name, format!("{v:?} is not a whole number of days"))),
        }
    };
    Ok(Some(crate::domain::retention::RetentionOverride {
        payload_days: days("payloadDays")?,
        history_days: days("historyDays")?,
    }))
}

/// `POST /tenants`: registers or changes a tenant (PlatformAdmin).
pub async fn put_tenant(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::Platform)?;
    console.principal().platform_scope()?;
    let result = async {
        let id = TenantId::parse_field("tenantId", fields.need("tenantId")?)?;
        let spec = TenantSpec {
            display_name: fields.get("displayName").map(str::to_string),
            edition: fields.need("edition")?.to_string(),
            residency_regions: fields
                .get("residencyRegions")
                .map(|r| {
                    r.split(',')
                        .map(|x| x.trim().to_string())
                        .filter(|x| !x.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            retention: retention_fields(&fields)?,
        };
        let tenant = console.state.capacity.put_tenant(id, spec).await?;
        Ok::<_, ApiError>(format!(
            "tenant {} saved (edition {})",
            tenant.tenant_id, tenant.edition
        ))
    }
    .await;
    Ok(console.done("/tenants", result))
}

/// `POST /tenants/{id}/projects`: registers a project.
pub async fn put_project(
    console: Console,
    Path(tenant_id): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::Admin)?;
    let result = async {
        let tenant = TenantId::parse_field("tenantId", &tenant_id)?;
        console.principal().scope_for(&tenant)?;
        let project = ProjectId::parse_field("projectId", fields.need("projectId")?)?;
        let p = console
            .state
            .capacity
            .put_project(
                tenant,
                project,
                fields.get("displayName").map(str::to_string),
            )
            .await?;
        Ok::<_, ApiError>(format!(
            "project {} saved in tenant {}",
            p.project_id, p.tenant_id
        ))
    }
    .await;
    Ok(console.done("/tenants", result))
}

// ---- users ------------------------------------------------------------------

#[derive(Template)]
#[template(path = "console/users.html")]
struct UsersPage {
    l: Layout,
    t: Table,
    roles: Vec<&'static str>,
    created: Option<(String, String)>,
}

fn users_table(console: &Console, q: &ListQuery) -> Result<Table, PageError> {
    let scope = console.scope()?;
    let list = users::list(&console.state.store, &scope)?;
    let actor = console.principal().actor();
    let rows = list
        .iter()
        .map(|u| {
            let mut actions = Vec::new();
            // Only what the viewer may do to this user is offered (the
            // services refuse the rest anyway, naming the scopes lacking).
            let manageable = actor.may_manage(&u.scopes(), "manage").is_ok()
                && u.username != console.session.username;
            if manageable && u.disabled_at.is_some() {
                actions.push(Action {
                    href: format!("/users/{}/enable", u.username),
                    label: "Enable".into(),
                    fields: vec![],
                    danger: false,
                    ask: None,
                });
            }
            if manageable && u.disabled_at.is_none() {
                actions.push(Action {
                    href: format!("/users/{}/reset", u.username),
                    label: "Reset password".into(),
                    fields: vec![],
                    danger: false,
                    ask: None,
                });
                actions.push(Action {
                    href: format!("/users/{}/disable", u.username),
                    label: "Disable".into(),
                    fields: vec![],
                    danger: true,
                    ask: None,
                });
            }
            vec![
                Cell::text(&u.username),
                Cell::text(&u.display_name),
                Cell::text(u.email.clone().unwrap_or_default()),
                Cell::text(u.tenant_id.as_str()),
                Cell::text(
                    u.roles
                        .iter()
                        .map(|r| r.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
                Cell::State(
                    if u.disabled_at.is_some() {
                        "disabled"
                    } else {
                        "active"
                    }
                    .into(),
                ),
                Cell::text(&u.created_by),
                Cell::time(&u.created_at),
                Cell::Actions(actions),
            ]
        })
        .collect();
    Ok(q.table(
        "users",
        "/users",
        &[
            "User",
            "Name",
            "Mail",
            "Tenant",
            "Roles",
            "State",
            "Created by",
            "Created",
            "Actions",
        ],
        rows,
        vec![],
        "No users in this tenant.",
    ))
}

fn assignable_roles(console: &Console) -> Vec<&'static str> {
    Role::ALL
        .iter()
        .filter(|r| **r != Role::PlatformAdmin || console.viewing().is_platform())
        .filter(|r| r.scopes().is_subset(&console.session.scopes))
        .map(|r| r.as_str())
        .collect()
}

/// The users page with a generated password shown once, in the answer to
/// the form that made it (never in a redirect or a later page).
fn users_page_with_password(
    console: &Console,
    message: String,
    username: String,
    password: String,
) -> Result<Response, PageError> {
    let t = users_table(console, &ListQuery::parse(&RawQuery(None)))?;
    let mut l = console.layout("Users", "/users");
    l.flash = Some(crate::auth::session::Flash {
        ok: true,
        text: message,
        field: None,
    });
    render(&UsersPage {
        l,
        t,
        roles: assignable_roles(console),
        created: Some((username, password)),
    })
}

/// `GET /users`: the tenant's console users (WorkspaceAdmin, PlatformAdmin).
pub async fn users(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::Admin)?;
    let q = ListQuery::parse(&raw);
    let t = users_table(&console, &q)?;
    render(&UsersPage {
        l: console.layout("Users", "/users"),
        t,
        roles: assignable_roles(&console),
        created: None,
    })
}

/// `POST /users/email`: sets or clears the mail address of a user of the
/// tenant shown.
pub async fn set_email(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::Admin)?;
    let scope = console.scope()?;
    let result = async {
        let user = users::set_email(
            &console.state.store,
            &console.principal().actor(),
            scope,
            fields.need("username")?,
            fields.get("email").unwrap_or_default().trim(),
            console.state.clock.now(),
        )
        .await?;
        Ok::<_, ApiError>(match user.email {
            Some(e) => format!("{} is mailed at {e}", user.username),
            None => format!("{} has no mail address now", user.username),
        })
    }
    .await;
    Ok(console.done("/users", result))
}

/// `POST /users`: creates a user in the tenant shown; the password is the
/// one given or a generated one shown once.
pub async fn create_user(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::Admin)?;
    let scope = console.scope()?;
    let result = async {
        let roles = parse_roles(&fields.all("roles"))?;
        let (user, generated) = users::create(
            &console.state.store,
            &console.principal().actor(),
            users::NewUser {
                tenant: scope.clone(),
                username: fields.need("username")?,
                display_name: fields.get("displayName").unwrap_or_default(),
                roles,
                password: fields.get("password"),
                email: fields.get("email").unwrap_or_default().trim(),
            },
            console.state.clock.now(),
        )
        .await?;
        Ok::<_, ApiError>((user.username, generated))
    }
    .await;
    match result {
        Ok((username, Some(password))) => users_page_with_password(
            &console,
            format!("user {username} created; the generated password is shown once below"),
            username,
            password,
        ),
        Ok((username, None)) => Ok(console.done(
            "/users",
            Ok::<_, ApiError>(format!("user {username} created")),
        )),
        Err(e) => Ok(console.done("/users", Err::<String, _>(e))),
    }
}

/// `POST /users/{name}/reset`: a new generated password, shown once; the
/// user's sessions end.
pub async fn reset_password(
    console: Console,
    Path(username): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    console.form(raw)?;
    console.require(Scope::Admin)?;
    let scope = console.scope()?;
    if username == console.session.username {
        return Ok(console.done(
            "/users",
            Err::<String, _>(ApiError::invalid(
                "username",
                "change your own password on the Account page",
            )),
        ));
    }
    let password = users::generate_password();
    let result = users::set_password(
        &console.state.store,
        &console.principal().actor(),
        scope,
        &username,
        &password,
        console.state.clock.now(),
    )
    .await;
    match result {
        Ok(user) => {
            console.state.sessions.end_user(&user.username);
            users_page_with_password(
                &console,
                format!(
                    "password of {} reset; its sessions ended; the new password is shown once below",
                    user.username
                ),
                user.username,
                password,
            )
        }
        Err(e) => Ok(console.done("/users", Err::<String, _>(e))),
    }
}

/// `POST /users/{name}/disable`: the user cannot sign in any more and its
/// sessions end now.
pub async fn disable_user(
    console: Console,
    Path(username): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    console.form(raw)?;
    console.require(Scope::Admin)?;
    let scope = console.scope()?;
    if username == console.session.username {
        return Ok(console.done(
            "/users",
            Err::<String, _>(ApiError::invalid("username", "you cannot disable yourself")),
        ));
    }
    let result = users::disable(
        &console.state.store,
        &console.principal().actor(),
        scope,
        &username,
        console.state.clock.now(),
    )
    .await
    .map(|u| {
        console.state.sessions.end_user(&u.username);
        format!("user {} disabled; its sessions ended", u.username)
    });
    Ok(console.done("/users", result))
}

/// `POST /users/{name}/enable`: a disabled user may sign in again.
pub async fn enable_user(
    console: Console,
    Path(username): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    console.form(raw)?;
    console.require(Scope::Admin)?;
    let scope = console.scope()?;
    let result = users::enable(
        &console.state.store,
        &console.principal().actor(),
        scope,
        &username,
        console.state.clock.now(),
    )
    .await
    .map(|u| format!("user {} enabled; it may sign in again", u.username));
    Ok(console.done("/users", result))
}

// ---- client credentials -----------------------------------------------------

#[derive(Template)]
#[template(path = "console/clients.html")]
struct ClientsPage {
    l: Layout,
    t: Table,
    scopes: Vec<&'static str>,
    created: Option<(String, String)>,
}

fn clients_table(console: &Console) -> Result<Table, PageError> {
    let scope = console.scope()?;
    let list = clients::list(&console.state.store, &scope)?;
    let actor = console.principal().actor();
    let rows = list
        .iter()
        .map(|c| {
            let actions = if c.revoked_at.is_none() && actor.may_manage(&c.scopes, "revoke").is_ok()
            {
                vec![Action {
                    href: format!("/clients/{}/revoke", c.client_id),
                    label: "Revoke".into(),
                    fields: vec![],
                    danger: true,
                    ask: None,
                }]
            } else {
                vec![]
            };
            vec![
                Cell::code(&c.client_id),
                Cell::text(&c.description),
                Cell::text(
                    c.scopes
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
                Cell::State(
                    if c.revoked_at.is_some() {
                        "revoked"
                    } else {
                        "active"
                    }
                    .into(),
                ),
                Cell::time(&c.created_at),
                Cell::time_opt(&c.revoked_at),
                Cell::Actions(actions),
            ]
        })
        .collect();
    Ok(ListQuery::parse(&RawQuery(None)).table(
        "clients",
        "/clients",
        &[
            "Client",
            "Description",
            "Scopes",
            "State",
            "Created",
            "Revoked",
            "Actions",
        ],
        rows,
        vec![],
        "No client credentials in this tenant.",
    ))
}

fn grantable_scopes(console: &Console) -> Vec<&'static str> {
    Scope::ALL
        .iter()
        .filter(|s| console.can(**s))
        .filter(|s| **s != Scope::Platform || console.viewing().is_platform())
        .map(|s| s.as_str())
        .collect()
}

/// `GET /clients`: the tenant's client credentials.
pub async fn clients(console: Console) -> Result<Response, PageError> {
    console.require(Scope::Admin)?;
    let t = clients_table(&console)?;
    render(&ClientsPage {
        l: console.layout("Client credentials", "/clients"),
        t,
        scopes: grantable_scopes(&console),
        created: None,
    })
}

/// `POST /clients`: creates a credential; its secret is shown once, on the
/// answer to this form, and never again.
pub async fn create_client(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::Admin)?;
    let scope = console.scope()?;
    let result = async {
        let scopes = parse_scopes(&fields.all("scopes"))?;
        let (credential, secret) = clients::create(
            &console.state.store,
            &console.principal().actor(),
            scope,
            scopes,
            fields.get("description").unwrap_or_default(),
            console.state.clock.now(),
        )
        .await?;
        Ok::<_, ApiError>((credential.client_id, secret))
    }
    .await;
    match result {
        Ok(created) => {
            let t = clients_table(&console)?;
            let mut l = console.layout("Client credentials", "/clients");
            l.flash = Some(crate::auth::session::Flash {
                ok: true,
                text: format!(
                    "client {} created; its secret is shown once below",
                    created.0
                ),
                field: None,
            });
            render(&ClientsPage {
                l,
                t,
                scopes: grantable_scopes(&console),
                created: Some(created),
            })
        }
        Err(e) => Ok(console.done("/clients", Err::<String, _>(e))),
    }
}

/// `POST /clients/{id}/revoke`.
pub async fn revoke_client(
    console: Console,
    Path(client_id): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    console.form(raw)?;
    console.require(Scope::Admin)?;
    let scope = console.scope()?;
    let result = clients::revoke(
        &console.state.store,
        Some(&console.state.auth),
        &console.principal().actor(),
        scope,
        &client_id,
        console.state.clock.now(),
    )
    .await
    .map(|c| {
        format!(
            "client {} revoked; its tokens stop working now",
            c.client_id
        )
    });
    Ok(console.done("/clients", result))
}

// ---- publisher keys ---------------------------------------------------------

#[derive(Template)]
#[template(path = "console/keys.html")]
struct KeysPage {
    l: Layout,
    t: Table,
}

/// `GET /keys`: trusted and revoked publisher keys (PlatformAdmin), with
/// forms to trust and revoke.
pub async fn keys(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::Platform)?;
    console.principal().platform_scope()?;
    let q = ListQuery::parse(&raw);
    let keys = console.state.releases.keys().map_err(ApiError::from)?;
    let rows = keys
        .iter()
        .map(|k| {
            let mut actions = Vec::new();
            if k.state == crate::domain::trust::KeyState::Trusted {
                actions.push(Action {
                    href: format!("/keys/{}/revoke", k.key_id),
                    label: "Revoke".into(),
                    fields: Vec::new(),
                    danger: true,
                    ask: Some("why revoke it (required)"),
                });
            }
            vec![
                Cell::text(&k.name),
                Cell::code(&k.key_id),
                Cell::State(k.state.as_str().to_lowercase()),
                Cell::text(if k.tenants.is_empty() {
                    "any".to_string()
                } else {
                    k.tenants
                        .iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                }),
                Cell::text(format!("{} ({})", k.source.as_str(), k.trusted_by)),
                Cell::text(match (&k.revoked_by, &k.revoke_reason, &k.revoked_at) {
                    (Some(by), Some(why), Some(at)) => format!("by {by} at {}: {why}", when(at)),
                    _ => String::new(),
                }),
                Cell::Actions(actions),
            ]
        })
        .collect();
    let t = q.table(
        "keys",
        "/keys",
        &[
            "Name",
            "Key",
            "State",
            "May sign for",
            "Source",
            "Revoked",
            "Actions",
        ],
        rows,
        vec![],
        "No publisher keys are trusted: every imported release is Untrusted until one is.",
    );
    render(&KeysPage {
        l: console.layout("Publisher keys", "/keys"),
        t,
    })
}

/// `POST /keys`: trusts a publisher key.
pub async fn trust_key(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::Platform)?;
    console.principal().platform_scope()?;
    let result = async {
        let tenants: Vec<String> = fields
            .get("tenants")
            .unwrap_or_default()
            .split(',')
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect();
        let (key, change, done) = console
            .state
            .releases
            .trust_key(
                fields.need("name")?,
                fields.need("publicKey")?,
                &tenants,
                fields.get("replace").is_some_and(|v| v == "on"),
                &console.principal().subject.to_string(),
            )
            .await?;
        Ok::<_, ApiError>(match change {
            Some(change) => format!(
                "publisher key {} {change}; stored releases verified again: {done}",
                key.key_id
            ),
            None => format!(
                "publisher key {} ({}) was already trusted so: nothing changed",
                key.key_id, key.name
            ),
        })
    }
    .await;
    Ok(console.done("/keys", result))
}

/// `POST /keys/{id}/revoke`: revokes a publisher key.
pub async fn revoke_key(
    console: Console,
    Path(key_id): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::Platform)?;
    console.principal().platform_scope()?;
    let result = async {
        let (key, done) = console
            .state
            .releases
            .revoke_key(
                &key_id,
                fields.get("reason").unwrap_or_default(),
                &console.principal().subject.to_string(),
            )
            .await?;
        Ok::<_, ApiError>(format!(
            "publisher key {} ({}) is revoked; stored releases verified again: {done}",
            key.key_id, key.name
        ))
    }
    .await;
    Ok(console.done("/keys", result))
}

// ---- system -----------------------------------------------------------------

#[derive(Template)]
#[template(path = "console/system.html")]
struct SystemPage {
    l: Layout,
    facts: Vec<(&'static str, String)>,
    t: Table,
    /// The site's model profiles: profile, for whom, servers, model,
    /// limits, and what the server is doing now.
    models: Vec<[String; 6]>,
}

/// What this host enforces on tool processes, in one line.
fn tool_confinement(state: &crate::api::AppState) -> String {
    #[cfg(unix)]
    {
        let h = state.runtime.confinement();
        let mechanism = match h.mechanism.as_str() {
            "refused" => "REFUSED: no cgroup, and runtime.when_unconfinable is refuse".to_string(),
            "rlimit" => format!(
                "rlimit and a process group only (no cgroup: {})",
                h.cgroup_unavailable
                    .as_deref()
                    .unwrap_or("runtime.confinement is rlimit")
            ),
            m => format!("{m} (CPU, memory and processes per lease)"),
        };
        format!("{mechanism}; network: {}; files: {}", h.network, h.files)
    }
    #[cfg(windows)]
    {
        let h = state.runtime.confinement();
        format!(
            "{} ({}); kill-on-close: {}; network: {}; files: {}",
            h.mechanism, h.limits, h.kill_on_close, h.network, h.files
        )
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = state;
        "not confined on this platform".to_string()
    }
}

/// `GET /system`: the appliance itself (PlatformAdmin): version, store,
/// certificate, sessions and every background worker with its last pass.
pub async fn system(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::Platform)?;
    console.principal().platform_scope()?;
    let state = &console.state;
    let q = ListQuery::parse(&raw);
    let stats = state.store.commit_stats();
    let disk = state.store.size_on_disk().unwrap_or(0);
    let records: usize = state.store.table_sizes().values().sum();
    let retention = state.reloader.retention.get().defaults();
    let backup = match &state.backups {
        None => "off: no backup.dir is configured (the packaged configuration backs up every 15 minutes)".to_string(),
        Some(b) => {
            let r = b.report(state.clock.now());
            let last = match (&r.last, r.age_seconds) {
                (Some(l), Some(age)) => format!(
                    "last {} ({:.1} MiB, {} ago, {})",
                    l.file.display(),
                    l.size_bytes as f64 / 1_048_576.0,
                    crate::console::ago(age),
                    match l.verified {
                        Some(true) => "verified",
                        Some(false) => "NOT verified",
                        None => "from before this start, not verified since",
                    }
                ),
                _ => "none yet".to_string(),
            };
            let failure = r
                .error
                .map(|e| format!("; the last attempt FAILED: {e}"))
                .unwrap_or_default();
            format!(
                "every {} min into {}, keeping {}; {last}{failure}",
                r.interval_minutes,
                r.dir.display(),
                r.keep
            )
        }
    };
    let facts = vec![
        (
            "Version",
            format!(
                "{} (store schema {})",
                env!("CARGO_PKG_VERSION"),
                state.store.schema_version()
            ),
        ),
        ("Started", when(&state.started_at)),
        ("Configuration", {
            let (at, from, reloads) = state.reloader.loaded();
            format!(
                "loaded {} from {from}{}; reload with `agentbay reload` or SIGHUP",
                when(&at),
                if reloads > 0 {
                    format!(" ({reloads} reloads since the start)")
                } else {
                    String::new()
                }
            )
        }),
        (
            "Data directory",
            state.config.data_dir.display().to_string(),
        ),
        ("Tool processes", tool_confinement(state)),
        (
            "Store",
            format!(
                "{:.1} MiB on disk, {records} records",
                disk as f64 / 1_048_576.0
            ),
        ),
        (
            "Durable commits",
            format!(
                "{} in {} groups, {} flushes",
                stats.commits, stats.groups, stats.flushes
            ),
        ),
        ("Certificate", state.tls.fingerprint.clone()),
        (
            "Local CA",
            state
                .tls
                .ca_fingerprint
                .clone()
                .unwrap_or_else(|| "none (configured certificate)".into()),
        ),
        ("Backups", backup),
        (
            "Retention (defaults)",
            format!(
                "payloads {} days, history {} days after a run ends; per-tenant overrides on the Tenants page",
                retention.payload_days, retention.history_days
            ),
        ),
        ("Console sessions", state.sessions.count().to_string()),
        ("Live attempts", state.runtime.live().len().to_string()),
        (
            "Pools and this host",
            match state.capacity.host_fit() {
                None => "this host's CPUs and memory could not be read".to_string(),
                Some(fit) if fit.warnings.is_empty() => fit.summary(),
                Some(fit) => format!("{}. WARNING: {}", fit.summary(), fit.warnings.join("; ")),
            },
        ),
    ];
    let rows = state
        .workers
        .statuses()
        .into_iter()
        .map(|w| {
            vec![
                Cell::text(w.name),
                Cell::State(
                    if !w.alive {
                        "Failed"
                    } else if w.last_ok {
                        "Active"
                    } else {
                        "failed"
                    }
                    .into(),
                ),
                Cell::text(format!("{}; retry {}", w.schedule, w.retry)),
                Cell::time_opt(&w.next_run_at),
                Cell::num(w.runs as u32),
                Cell::text(if w.consecutive_failures > 0 {
                    format!("{} ({} in a row)", w.failures, w.consecutive_failures)
                } else {
                    w.failures.to_string()
                }),
                Cell::time_opt(&w.last_run_at),
                Cell::text(w.last_message.unwrap_or_default()),
                Cell::text(match (&w.last_failure_at, &w.last_failure) {
                    (Some(at), Some(e)) => format!("{}: {e}", when(at)),
                    _ => "none".into(),
                }),
                Cell::Actions(vec![Action {
                    href: "/system/workers".into(),
                    label: "Run now".into(),
                    fields: vec![("worker".into(), w.name.into())],
                    danger: false,
                    ask: None,
                }]),
            ]
        })
        .collect();
    let t = q.table(
        "workers",
        "/system",
        &[
            "Worker",
            "State",
            "Schedule",
            "Next pass",
            "Passes",
            "Failures",
            "Last pass",
            "Last message",
            "Last failure",
            "Actions",
        ],
        rows,
        vec![],
        "No workers.",
    );
    let models = crate::runtime::profiles::list(&state.store)?
        .into_iter()
        .map(|p| {
            [
                p.profile_id.clone(),
                p.scope_text(),
                p.servers().join(", then "),
                p.model.clone(),
                p.limits.describe(),
                state.runtime.model_server_now(&p.endpoint),
            ]
        })
        .collect();
    render(&SystemPage {
        l: console.layout("System", "/system"),
        facts,
        t,
        models,
    })
}

/// `POST /system/workers`: one pass of a worker now.
pub async fn run_worker(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::Platform)?;
    console.principal().platform_scope()?;
    let name = fields.need("worker")?.to_string();
    let result = match console.state.workers.run_now(&name).await {
        Some(status) => Ok(format!(
            "{} ran: {}",
            status.name,
            status.last_message.unwrap_or_else(|| "done".into())
        )),
        None => Err(ApiError::invalid(
            "worker",
            format!("no worker is called {name:?}"),
        )),
    };
    Ok(console.done("/system", result))
}

/// `GET /webhooks`: the tenant's webhook endpoints.
pub async fn webhooks(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::Admin)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    let rows = console
        .state
        .webhooks
        .list(&scope)
        .map_err(ApiError::from)?
        .into_iter()
        .map(|e| {
            vec![
                Cell::id(e.endpoint_id, format!("/webhooks/{}", e.endpoint_id)),
                Cell::code(crate::domain::reach::redacted(&e.spec.url)),
                Cell::text(
                    e.spec
                        .events
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
                Cell::State(if e.spec.enabled { "Active" } else { "Disabled" }.into()),
                Cell::text(e.spec.description.clone()),
                Cell::text(format!("{} by {}", when(&e.created_at), e.created_by)),
            ]
        })
        .collect();
    let t = q.table(
        "webhooks",
        "/webhooks",
        &[
            "Endpoint",
            "URL",
            "Events",
            "State",
            "Description",
            "Registered",
        ],
        rows,
        vec![],
        "No webhook endpoints: register one with POST /factory/webhooks (README, Webhooks).",
    );
    render(&ListPage {
        l: console.layout("Webhooks", "/webhooks"),
        intro: "Endpoints that receive signed messages (Standard Webhooks) when a decision is requested or about to expire, a run ends, a call becomes Uncertain or a lease waits too long. Register, change and rotate them over the API (POST /factory/webhooks); the secret is shown once. Each endpoint's page lists its deliveries with every try.".into(),
        t,
    })
}

/// `GET /webhooks/{id}`: an endpoint's deliveries with their tries.
pub async fn webhook(
    console: Console,
    Path(id): Path<String>,
    raw: RawQuery,
) -> Result<Response, PageError> {
    console.require(Scope::Admin)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    let id =
        uuid::Uuid::parse_str(&id).map_err(|_| ApiError::invalid("endpointId", "is not a UUID"))?;
    let endpoint = console
        .state
        .webhooks
        .get(&scope, id)
        .map_err(ApiError::from)?;
    let rows = console
        .state
        .webhooks
        .deliveries(&scope, id, 200)
        .map_err(ApiError::from)?
        .into_iter()
        .map(|d| {
            let tries = d
                .tries
                .iter()
                .map(|t| {
                    format!(
                        "{}: {}{} ({} ms)",
                        when(&t.at),
                        t.status
                            .map(|s| s.to_string())
                            .unwrap_or_else(|| "no answer".into()),
                        t.error
                            .as_ref()
                            .map(|e| format!(", {e}"))
                            .unwrap_or_default(),
                        t.duration_ms
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            vec![
                Cell::code(d.message_id.clone()),
                Cell::text(d.event.as_str()),
                Cell::text(d.subject_tenant.to_string()),
                Cell::State(format!("{:?}", d.state)),
                Cell::time(&d.created_at),
                Cell::time_opt(&d.next_try_at),
                Cell::num(d.tries.len() as u32),
                Cell::text(tries),
            ]
        })
        .collect();
    let t = q.table(
        "deliveries",
        &format!("/webhooks/{id}"),
        &[
            "webhook-id",
            "Type",
            "About tenant",
            "State",
            "Created",
            "Next try",
            "Tries",
            "Each try",
        ],
        rows,
        vec![],
        "No deliveries yet.",
    );
    render(&ListPage {
        l: console.layout("Webhook deliveries", "/webhooks"),
        intro: format!(
            "Deliveries to {} ({}), newest first. A failed try is retried with exponential backoff; a receiver de-duplicates by webhook-id.",
            crate::domain::reach::redacted(&endpoint.spec.url),
            endpoint
                .spec
                .events
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        t,
    })
}

#[derive(Template)]
#[template(path = "console/audit.html")]
struct AuditPage {
    l: Layout,
    t: Table,
    /// The same query, for the export links.
    query: String,
    /// What a check of the chain found, when asked.
    chain: Option<crate::domain::audit::TrailReport>,
    /// Whether the reader may check the chain (it spans every tenant).
    may_verify: bool,
}

/// The query of an audit page as the API reads it, with what the reader
/// may see: its tenant, or every tenant for a PlatformAdmin.
fn audit_query(console: &Console, raw: &RawQuery) -> Result<AuditQuery, PageError> {
    let mut pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(raw.0.as_deref().unwrap_or("")).unwrap_or_default();
    // The filter bar sends every field, the empty ones too; the table's
    // cursor is `before`.
    pairs.retain(|(_, v)| !v.trim().is_empty());
    for (k, _) in &mut pairs {
        if k == "before" {
            "olderThan".clone_into(k);
        }
    }
    Ok(crate::api::audit::query_of(&console.principal(), &pairs)?)
}

/// `GET /audit`: who did what, to what, from where, and what it changed.
pub async fn audit(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::Admin)?;
    let q = ListQuery::parse(&raw);
    let mut query = audit_query(&console, &raw)?;
    query.limit = query.limit.min(200);
    let page = crate::api::audit::page_of(&console.state, &query)?;
    let all_tenants = query.filter.tenant.is_none();
    let rows = page
        .records
        .iter()
        .map(|r| {
            let change = match (&r.before, &r.after) {
                (Some(b), Some(a)) => format!("{b} → {a}"),
                (None, Some(a)) => a.to_string(),
                (Some(b), None) => format!("{b} → (removed)"),
                (None, None) => String::new(),
            };
            vec![
                Cell::Num(r.sequence as f64, r.sequence.to_string()),
                Cell::time(&r.at),
                Cell::text(r.tenant_id.to_string()),
                Cell::text(r.actor.clone()),
                Cell::text(format!("{} ({})", r.address, r.via.as_str())),
                Cell::text(r.action.clone()),
                Cell::words(r.target.clone()),
                Cell::words(change),
                Cell::text(r.detail.clone().unwrap_or_default()),
                Cell::words(r.hash.clone()),
            ]
        })
        .collect();
    let mut actions: Vec<String> = crate::domain::audit::actions()
        .into_iter()
        .map(String::from)
        .collect();
    actions.insert(0, String::new());
    let filters = vec![
        q.filter("action", "Action", actions),
        q.filter("actor", "Actor", Vec::new()),
        q.filter("target", "Target", Vec::new()),
        q.day_filter("from", "From"),
        q.day_filter("to", "To"),
    ];
    let t = q.history_table(
        "audit",
        "/audit",
        &[
            "#", "When", "Tenant", "Actor", "From", "Action", "Target", "Change", "Detail", "Hash",
        ],
        rows,
        filters,
        "No audit record matches: decisions, cancels, holds, releases, trust, quotas, pools, users, clients, reloads and sign-ins appear here as they happen.",
        None,
        page.next_older_than.map(|b| b.to_string()),
    );
    let may_verify = console.platform_admin();
    let chain = if may_verify && q.get("verify").is_some() {
        let store = console.state.store.clone();
        Some(
            tokio::task::spawn_blocking(move || store.verify_audit(&Default::default()))
                .await
                .map_err(ApiError::internal)?
                .map_err(ApiError::internal)?,
        )
    } else {
        None
    };
    let mut export: Vec<(String, String)> =
        serde_urlencoded::from_str(raw.0.as_deref().unwrap_or("")).unwrap_or_default();
    export.retain(|(k, v)| {
        !v.is_empty()
            && AuditQuery::PARAMS.contains(&k.as_str())
            && k != "olderThan"
            && k != "limit"
    });
    let title = if all_tenants {
        "Audit trail (every tenant)"
    } else {
        "Audit trail"
    };
    render(&AuditPage {
        l: console.layout(title, "/audit"),
        t,
        query: serde_urlencoded::to_string(&export).unwrap_or_default(),
        chain,
        may_verify,
    })
}

/// `GET /audit.csv`.
pub async fn audit_csv(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    audit_export(console, "audit.csv", raw).await
}

/// `GET /audit.json`.
pub async fn audit_json(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    audit_export(console, "audit.json", raw).await
}

/// The records of the page's filter (up to 10 000, newest first) to take
/// away, as `format` (`audit.csv` or `audit.json`).
async fn audit_export(
    console: Console,
    format: &str,
    raw: RawQuery,
) -> Result<Response, PageError> {
    console.require(Scope::Admin)?;
    let mut query = audit_query(&console, &raw)?;
    query.limit = crate::domain::audit::MAX_AUDIT_PAGE;
    query.before = None;
    let page = crate::api::audit::page_of(&console.state, &query)?;
    let (body, content_type) = match format {
        "audit.csv" => (
            crate::api::audit::csv_of(&page.records),
            "text/csv; charset=utf-8",
        ),
        "audit.json" => (
            serde_json::to_string_pretty(&page.records).map_err(ApiError::internal)?,
            "application/json",
        ),
        _ => return Err(PageError::bad(format!("no export {format}"))),
    };
    Ok((
        [
            (axum::http::header::CONTENT_TYPE, content_type.to_string()),
            (
                axum::http::header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"agentbay-{format}\""),
            ),
        ],
        body,
    )
        .into_response())
}
