//! The store's own suite: what any future backend behind the facade must
//! pass too.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::*;
use crate::domain::events::{EventFilter, NewEvent};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Note {
    tenant: TenantId,
    id: String,
    text: String,
}

impl Record for Note {
    // The clients tree doubles as a scratch table here.
    const TABLE: Table = Table::Clients;
    const VERSION: u16 = 2;
    fn tenant(&self) -> &TenantId {
        &self.tenant
    }
    fn id(&self) -> String {
        self.id.clone()
    }
    fn upgrade(version: u16, bytes: &[u8]) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct V1 {
            tenant: TenantId,
            id: String,
            body: String,
        }
        match version {
            1 => {
                let v1: V1 = rmp_serde::from_slice(bytes).map_err(|e| e.to_string())?;
                Ok(Note {
                    tenant: v1.tenant,
                    id: v1.id,
                    text: v1.body,
                })
            }
            v => Err(format!("no upgrade from version {v}")),
        }
    }
}

/// A versioned aggregate for the optimistic-concurrency tests: a counter
/// that never goes down and that stops for good at `done`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Tally {
    tenant: TenantId,
    id: String,
    count: u64,
    done: bool,
    version: u64,
}

impl Record for Tally {
    // The runs tree doubles as a scratch table here.
    const TABLE: Table = Table::Runs;
    const VERSION: u16 = 1;
    const VERSIONED: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant
    }
    fn id(&self) -> String {
        self.id.clone()
    }
}

/// What the tally's rules read of its stored state.
#[derive(Deserialize)]
struct StoredTally {
    count: u64,
    done: bool,
    version: u64,
}

impl StoredTally {
    fn check_successor(&self, next: &Tally) -> Result<(), String> {
        if next.count < self.count {
            return Err(format!("the count is {}; it never goes down", self.count));
        }
        if self.done && !next.done {
            return Err("a finished tally stays finished".into());
        }
        Ok(())
    }
}

crate::versioned!(Tally, version, StoredTally);

fn tally(scope: &TenantScope, id: &str) -> Tally {
    Tally {
        tenant: scope.tenant().clone(),
        id: id.into(),
        count: 0,
        done: false,
        version: 0,
    }
}

/// Saves `t` in its own transaction; the saved record or the error.
async fn save(store: &Store, scope: &TenantScope, t: &Tally) -> Result<Tally, StoreError> {
    let (scope, mut t) = (scope.clone(), t.clone());
    store
        .transact(move |tx: &mut Tx| {
            tx.save(&scope, &mut t)?;
            Ok(t)
        })
        .await
}

fn tenant(name: &str) -> TenantScope {
    TenantScope::new(TenantId::parse(name).unwrap())
}

fn note(scope: &TenantScope, id: &str, text: &str) -> Note {
    Note {
        tenant: scope.tenant().clone(),
        id: id.into(),
        text: text.into(),
    }
}

fn open(dir: &std::path::Path) -> Store {
    Store::open(&dir.join("store"), &StoreOptions::default()).unwrap()
}

#[path = "../../tests/common/pg.rs"]
mod pg;

/// Where a test's store is kept: a directory, and a database of the
/// test PostgreSQL cluster when the store is there.
struct Place {
    dir: tempfile::TempDir,
    options: StoreOptions,
}

impl Place {
    fn sled() -> Place {
        Place {
            dir: tempfile::tempdir().unwrap(),
            options: StoreOptions::default(),
        }
    }

    fn postgres() -> Place {
        let url = pg::PgCluster::shared().database();
        Place {
            dir: tempfile::tempdir().unwrap(),
            options: StoreOptions {
                backend: Backend::Postgres(PgOptions {
                    url,
                    ca_file: None,
                    node: "test".into(),
                    advertise: "https://test.invalid:8443".into(),
                    fingerprint: String::new(),
                    lease: std::time::Duration::from_secs(10),
                    pair: Some(crate::domain::cluster::PairKey::from_bytes(&[1; 32])),
                }),
                ..StoreOptions::default()
            },
        }
    }

    /// The test's own directory (backups, restores).
    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    fn open(&self) -> Store {
        Store::open(&self.dir.path().join("store"), &self.options).unwrap()
    }
}

impl Place {
    /// The URL of the PostgreSQL store.
    fn pg_url(&self) -> &str {
        match &self.options.backend {
            Backend::Postgres(pg) => &pg.url,
            Backend::Sled => panic!("a sled place"),
        }
    }

    /// The options of another appliance on the same store.
    fn as_node(&self, node: &str) -> StoreOptions {
        let mut options = self.options.clone();
        if let Backend::Postgres(pg) = &mut options.backend {
            pg.node = node.into();
        }
        options
    }
}

#[tokio::test]
async fn on_postgres_a_layout_1_store_gains_the_signed_leader_row_and_an_unsigned_one_is_not_believed()
 {
    let place = Place::postgres();
    // As an agentbay before signed rows left it, held by an appliance
    // whose lease runs.
    pg::PgCluster::shared().psql_in(
        place.pg_url(),
        "CREATE TABLE agentbay_layout (id int PRIMARY KEY CHECK (id = 1), version int NOT NULL);
         INSERT INTO agentbay_layout VALUES (1, 1);
         CREATE TABLE agentbay_leader (id int PRIMARY KEY, node text NOT NULL, url text NOT NULL,
             fingerprint text NOT NULL, epoch bigint NOT NULL, expires_at timestamptz NOT NULL);
         INSERT INTO agentbay_leader VALUES (1, 'old', 'https://old.invalid:8443', '', 4,
             now() + interval '1 hour');",
    );
    let err = Store::open(&place.path().join("store"), &place.options).unwrap_err();
    let StoreError::Standby { active, untrusted } = &err else {
        panic!("{err}")
    };
    assert_eq!((active.node.as_str(), active.epoch), ("old", 4));
    assert_eq!(
        untrusted,
        &Some(crate::domain::cluster::Untrusted::Unsigned)
    );
    assert!(err.to_string().contains("it is not signed"), "{err}");
    let layout =
        pg::PgCluster::shared().psql_in(place.pg_url(), "SELECT version FROM agentbay_layout");
    assert!(layout.contains('2'), "{layout}");

    // Once its lease ended, the row is taken and signed.
    pg::PgCluster::shared().psql_in(
        place.pg_url(),
        "UPDATE agentbay_leader SET expires_at = '-infinity'",
    );
    let store = place.open();
    let epoch = store.leadership().unwrap().epoch;
    assert_eq!(epoch, 5);
    let err = Store::open(&place.path().join("other"), &place.as_node("other")).unwrap_err();
    let StoreError::Standby { untrusted, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(untrusted, &None, "{err}");
}

#[tokio::test]
async fn on_postgres_one_appliance_holds_the_store_and_a_deposed_one_cannot_commit() {
    let place = Place::postgres();
    let store = place.open();
    let acme = tenant("acme");
    let n = note(&acme, "kept", "by the first epoch");
    let scope = acme.clone();
    store
        .transact(move |tx: &mut Tx| tx.put(&scope, &n))
        .await
        .unwrap();
    // While it holds the store, what it committed is read without asking
    // PostgreSQL (nothing but the holder writes the store): the row
    // removed behind its back is still read as committed.
    let cluster = pg::PgCluster::shared();
    cluster.psql_in(
        place.pg_url(),
        "DELETE FROM agentbay_kv WHERE key = 'acme/kept'",
    );
    assert!(store.get::<Note>(&acme, "kept").unwrap().is_some());
    let n = note(&acme, "kept", "by the first epoch, again");
    let scope = acme.clone();
    store
        .transact(move |tx: &mut Tx| tx.put(&scope, &n))
        .await
        .unwrap();
    let epoch = store.leadership().unwrap().epoch;

    // Another appliance stands by while the lease runs.
    let err = Store::open(&place.path().join("other"), &place.as_node("other")).unwrap_err();
    let StoreError::Standby { active, untrusted } = &err else {
        panic!("{err}")
    };
    assert_eq!((active.node.as_str(), active.epoch), ("test", epoch));
    assert_eq!(untrusted, &None, "the row is signed with the pair's key");

    // It takes the row over (as it would once the lease ran out): the
    // first appliance's next write is refused by the database, and
    // nothing of it is stored.
    cluster.psql_in(
        place.pg_url(),
        "UPDATE agentbay_leader SET node = 'other', epoch = epoch + 1, expires_at = now() + interval '1 hour'",
    );
    let late = note(&acme, "late", "from a deposed epoch");
    let scope = acme.clone();
    let err = store
        .transact(move |tx: &mut Tx| tx.put(&scope, &late))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no longer holds"), "{err}");
    assert!(store.healthy().is_err());
    assert_eq!(
        cluster.psql_in(
            place.pg_url(),
            "SELECT count(*) FROM agentbay_kv WHERE key = 'acme/late'"
        ),
        "0"
    );
    assert!(store.get::<Note>(&acme, "kept").unwrap().is_some());
    // What it committed itself is no longer the last word: the new holder
    // removes the record, and the deposed appliance reads that, not what
    // it knew.
    cluster.psql_in(
        place.pg_url(),
        "DELETE FROM agentbay_kv WHERE key = 'acme/kept'",
    );
    assert!(store.get::<Note>(&acme, "kept").unwrap().is_none());
}

/// The PostgreSQL store goes through the primary key only: writes and
/// deletes begun on an empty table (where PostgreSQL would first plan, and
/// cache, a scan of the whole table) and continued once it holds many
/// records never scan it.
#[tokio::test]
async fn on_postgres_no_statement_scans_the_whole_table() {
    let place = Place::postgres();
    let cluster = pg::PgCluster::shared();
    // A session's counts reach the statistics when it ends.
    let counts = || {
        let text = cluster.psql_in(
            place.pg_url(),
            "SELECT n_tup_ins || ' ' || n_tup_del || ' ' || seq_scan
             FROM pg_stat_user_tables WHERE relname = 'agentbay_kv'",
        );
        let n: Vec<u64> = text.split(' ').map(|n| n.parse().unwrap()).collect();
        (n[0], n[1], n[2])
    };
    let settled = |done: &dyn Fn((u64, u64, u64)) -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let now = counts();
            if done(now) || std::time::Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    // Creating the table builds its key, which PostgreSQL counts as a
    // scan: what follows is counted from there.
    drop(place.open());
    let (inserted, _, created) = settled(&|(i, _, _)| i > 0);
    assert!(inserted > 0, "the new store's first records never showed");
    let store = place.open();
    let acme = tenant("acme");
    let round = |from: usize| {
        let (store, scope) = (store.clone(), acme.clone());
        async move {
            for i in from..from + 12 {
                let (n, scope2) = (
                    note(&scope, &format!("n{i}"), "kept a moment"),
                    scope.clone(),
                );
                store
                    .transact(move |tx: &mut Tx| tx.put(&scope2, &n))
                    .await
                    .unwrap();
                let scope2 = scope.clone();
                store
                    .transact(move |tx: &mut Tx| tx.delete::<Note>(&scope2, &format!("n{i}")))
                    .await
                    .unwrap();
                assert!(
                    store
                        .get::<Note>(&scope, &format!("n{i}"))
                        .unwrap()
                        .is_none()
                );
            }
        }
    };
    round(0).await;
    cluster.psql_in(
        place.pg_url(),
        "INSERT INTO agentbay_kv (tree, key, value)
         SELECT 'clients', convert_to('zz/' || g, 'UTF8'), '\\x00' FROM generate_series(1, 20000) g;
         ANALYZE agentbay_kv",
    );
    round(100).await;
    drop(store);
    let (_, deleted, scans) = settled(&|(_, d, _)| d >= 24);
    assert!(
        deleted >= 24,
        "the store's 24 deletes never showed ({deleted})"
    );
    assert_eq!(
        scans - created,
        0,
        "the store scanned agentbay_kv whole {} times",
        scans - created
    );
}

/// Runs each named test on both backends: `<name>::sled` and
/// `<name>::postgres`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sled() {
                super::$name(super::Place::sled()).await
            }

            #[tokio::test]
            async fn postgres() {
                super::$name(super::Place::postgres()).await
            }
        }
    )*};
}

on_both_backends!(
    records_are_read_back_only_under_their_tenant,
    a_write_under_another_tenants_scope_is_refused,
    an_aborted_transaction_writes_nothing_and_numbers_no_event,
    events_are_numbered_in_commit_order_across_concurrent_writers,
    acknowledged_writes_and_sequences_survive_reopening,
    older_record_versions_are_upgraded_and_newer_refused,
    oversized_records_are_refused_with_the_limit_named,
    pages_continue_after_the_last_id,
    indexes_follow_their_records_and_page_newest_first,
    shared_artifacts_go_with_their_last_reference,
    backup_restores_every_record_and_file,
    pruned_events_never_give_their_numbers_away,
    artifacts_are_shared_by_hash_but_read_only_by_their_tenants,
    a_versioned_write_derived_from_an_older_version_is_refused_and_changes_nothing,
    a_write_that_breaks_a_successor_rule_is_refused_whoever_makes_it,
    of_concurrent_writers_from_one_version_exactly_one_wins_even_within_one_group,
    get_latest_sees_a_queued_write_and_plain_reads_never_go_back,
    submit_then_answers_once_durable_at_once_when_aborted_and_closed_after_close,
    the_audit_chain_follows_commit_order_and_finds_an_edit
);

fn event(scope: &TenantScope, topic: &'static str) -> NewEvent {
    NewEvent {
        topic,
        tenant_id: scope.tenant().clone(),
        occurred_at: Utc::now(),
        payload: serde_json::json!({"n": 1}),
    }
}

async fn records_are_read_back_only_under_their_tenant(dir: Place) {
    let store = dir.open();
    let acme = tenant("acme");
    let globex = tenant("globex");
    let (a, g) = (note(&acme, "n1", "acme's"), note(&globex, "n1", "globex's"));
    store
        .transact(move |tx: &mut Tx| {
            tx.put(&acme, &a)?;
            tx.put(&globex, &g)?;
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
    let acme = tenant("acme");
    let got: Note = store.get(&acme, "n1").unwrap().unwrap();
    assert_eq!(got.text, "acme's");
    let listed: Vec<Note> = store.list(&acme).unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        store
            .get::<Note>(&tenant("initech"), "n1")
            .unwrap()
            .is_none()
    );
    // A tenant whose name is a prefix of another sees nothing of it.
    assert!(store.list::<Note>(&tenant("acm")).unwrap().is_empty());
}

async fn a_write_under_another_tenants_scope_is_refused(dir: Place) {
    let store = dir.open();
    let acme = tenant("acme");
    let sneaky = note(&tenant("globex"), "x", "mine now");
    let err = store
        .transact(move |tx: &mut Tx| tx.put(&acme, &sneaky))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TenantMismatch { .. }), "{err}");
    assert!(store.list::<Note>(&tenant("globex")).unwrap().is_empty());
}

async fn an_aborted_transaction_writes_nothing_and_numbers_no_event(dir: Place) {
    let store = dir.open();
    let acme = tenant("acme");
    let n = note(&acme, "n1", "never");
    let scope = acme.clone();
    let result: Result<(), StoreError> = store
        .transact(move |tx: &mut Tx| {
            tx.put(&scope, &n)?;
            tx.emit(event(&scope, "test.v1.noted"))?;
            Err(StoreError::Backup("changed my mind".into()))
        })
        .await;
    assert!(result.is_err());
    assert!(store.get::<Note>(&acme, "n1").unwrap().is_none());
    let scope = acme.clone();
    let seq = store
        .transact(move |tx: &mut Tx| tx.emit(event(&scope, "test.v1.noted")))
        .await
        .unwrap();
    assert_eq!(
        seq, 1,
        "the aborted event must not consume a sequence number"
    );
}

async fn events_are_numbered_in_commit_order_across_concurrent_writers(dir: Place) {
    let store = dir.open();
    let mut live = store.subscribe();
    let mut tasks = Vec::new();
    for w in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let scope = tenant(if w % 2 == 0 { "acme" } else { "globex" });
                let n = note(&scope, &format!("w{w}-{i}"), "x");
                store
                    .transact(move |tx: &mut Tx| {
                        tx.put(&scope, &n)?;
                        tx.emit(event(&scope, "test.v1.noted"))
                    })
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let all = store
        .events_after(&EventFilter::default(), 0, usize::MAX)
        .unwrap();
    let seqs: Vec<u64> = all.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
    // Live subscribers saw the same order.
    let mut seen = Vec::new();
    while let Ok(e) = live.try_recv() {
        seen.push(e.sequence);
    }
    assert_eq!(seen, seqs);
    // The tenant filter is a row filter.
    let acme_only = EventFilter {
        tenant: Some(TenantId::parse("acme").unwrap()),
        topics: vec![],
    };
    let acme_events = store.events_after(&acme_only, 0, usize::MAX).unwrap();
    assert_eq!(acme_events.len(), 200);
    assert!(acme_events.iter().all(|e| e.tenant_id.as_str() == "acme"));
    // Resume from the middle.
    let after = store
        .events_after(&EventFilter::default(), 390, 100)
        .unwrap();
    assert_eq!(after.first().unwrap().sequence, 391);
    assert_eq!(after.len(), 10);
}

async fn acknowledged_writes_and_sequences_survive_reopening(dir: Place) {
    {
        let store = dir.open();
        let scope = tenant("acme");
        let n = note(&scope, "kept", "durable");
        store
            .transact(move |tx: &mut Tx| {
                tx.put(&scope, &n)?;
                tx.index_put(&scope, "by-text", "durable", "kept")?;
                tx.emit(event(&scope, "test.v1.noted"))
            })
            .await
            .unwrap();
        store.close().unwrap();
    }
    let store = dir.open();
    let scope = tenant("acme");
    assert_eq!(
        store.get::<Note>(&scope, "kept").unwrap().unwrap().text,
        "durable"
    );
    assert_eq!(
        store.index_ids(&scope, "by-text", "durable").unwrap(),
        vec!["kept"]
    );
    let seq = store
        .transact(move |tx: &mut Tx| tx.emit(event(&scope, "test.v1.noted")))
        .await
        .unwrap();
    assert_eq!(seq, 2);
}

async fn older_record_versions_are_upgraded_and_newer_refused(dir: Place) {
    let store = dir.open();
    let scope = tenant("acme");
    #[derive(Serialize)]
    struct V1<'a> {
        tenant: &'a str,
        id: &'a str,
        body: &'a str,
    }
    let mut old = 1u16.to_be_bytes().to_vec();
    rmp_serde::encode::write_named(
        &mut old,
        &V1 {
            tenant: "acme",
            id: "old",
            body: "from v1",
        },
    )
    .unwrap();
    store.damage(Table::Clients, b"acme/old", Some(&old));
    let mut newer = 9u16.to_be_bytes().to_vec();
    newer.extend_from_slice(b"whatever");
    store.damage(Table::Clients, b"acme/new", Some(&newer));

    assert_eq!(
        store.get::<Note>(&scope, "old").unwrap().unwrap().text,
        "from v1"
    );
    let err = store.get::<Note>(&scope, "new").unwrap_err();
    assert!(
        matches!(err, StoreError::NewerRecord { version: 9, .. }),
        "{err}"
    );
}

async fn oversized_records_are_refused_with_the_limit_named(dir: Place) {
    let store = dir.open();
    let scope = tenant("acme");
    let big = note(&scope, "big", &"x".repeat(MAX_RECORD_BYTES));
    let err = store
        .transact(move |tx: &mut Tx| tx.put(&scope, &big))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("65536"), "{err}");
}

async fn pages_continue_after_the_last_id(dir: Place) {
    let store = dir.open();
    let scope = tenant("acme");
    let s = scope.clone();
    store
        .transact(move |tx: &mut Tx| {
            for i in 0..10 {
                tx.put(&s, &note(&s, &format!("n{i:02}"), "x"))?;
            }
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
    let first: Vec<Note> = store.list_page(&scope, None, 4).unwrap();
    let second: Vec<Note> = store.list_page(&scope, Some(&first[3].id), 4).unwrap();
    let ids: BTreeSet<String> = first
        .iter()
        .chain(second.iter())
        .map(|n| n.id.clone())
        .collect();
    assert_eq!(ids.len(), 8);
    assert_eq!(second[0].id, "n04");
}

/// A record that derives an index entry and artifact references.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Doc {
    tenant: TenantId,
    id: String,
    kind: String,
    refs: Vec<String>,
}

impl Record for Doc {
    // The users tree doubles as a scratch table here.
    const TABLE: Table = Table::Users;
    const VERSION: u16 = 1;
    const DERIVES: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant
    }
    fn id(&self) -> String {
        self.id.clone()
    }
    fn derive(&self, d: &mut Derived) {
        d.counted("kind", &*self.kind);
        for r in &self.refs {
            d.reference(Some(r));
        }
    }
}

fn doc(scope: &TenantScope, id: &str, kind: &str, refs: &[&str]) -> Doc {
    Doc {
        tenant: scope.tenant().clone(),
        id: id.into(),
        kind: kind.into(),
        refs: refs.iter().map(|r| r.to_string()).collect(),
    }
}

async fn indexes_follow_their_records_and_page_newest_first(dir: Place) {
    let store = dir.open();
    let scope = tenant("acme");
    let other = tenant("acmecorp");
    let (s, o) = (scope.clone(), other.clone());
    store
        .transact(move |tx: &mut Tx| {
            for i in 0..10 {
                let kind = if i % 2 == 0 { "even" } else { "odd/x" };
                tx.put(&s, &doc(&s, &format!("d{i:02}"), kind, &[]))?;
            }
            tx.put(&o, &doc(&o, "d99", "even", &[]))?;
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
    assert_eq!(store.index_count(&scope, "kind", "even").unwrap(), 5);
    assert_eq!(store.index_count(&scope, "kind", "odd/x").unwrap(), 5);
    let page: Vec<Doc> = store
        .page(&scope, Some(("kind", "even")), None, 3, |_| true)
        .unwrap();
    let ids: Vec<&str> = page.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["d08", "d06", "d04"], "only the scope's tenant");
    let next: Vec<Doc> = store
        .page(&scope, Some(("kind", "even")), Some("d04"), 3, |_| true)
        .unwrap();
    let ids: Vec<&str> = next.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["d02", "d00"]);
    // The table itself, newest first, with a filter.
    let all: Vec<Doc> = store
        .page(&scope, None, None, 4, |d: &Doc| d.kind != "even")
        .unwrap();
    let ids: Vec<&str> = all.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["d09", "d07", "d05", "d03"]);

    // A change moves the entry and the counts; a delete removes it.
    let s = scope.clone();
    store
        .transact(move |tx: &mut Tx| {
            tx.put(&s, &doc(&s, "d00", "odd/x", &[]))?;
            tx.delete::<Doc>(&s, "d02")
        })
        .await
        .unwrap();
    assert_eq!(store.index_count(&scope, "kind", "even").unwrap(), 3);
    assert_eq!(store.index_count(&scope, "kind", "odd/x").unwrap(), 6);
    assert_eq!(
        store.index_page(&scope, "kind", "even", None, 10).unwrap(),
        ["d08", "d06", "d04"]
    );
}

async fn shared_artifacts_go_with_their_last_reference(dir: Place) {
    let store = dir.open();
    let scope = tenant("acme");
    let other = tenant("globex");
    let now = chrono::Utc::now();
    let later = now + chrono::Duration::days(30);
    let (s, o) = (scope.clone(), other.clone());
    let hash = store
        .transact(move |tx: &mut Tx| {
            let h = tx.put_artifact(&s, b"shared prompt", "text/plain", Some(later), now)?;
            tx.put(&s, &doc(&s, "a", "k", &[&h]))?;
            tx.put(&s, &doc(&s, "b", "k", &[&h]))?;
            // Another tenant stores the same content.
            tx.put_artifact(&o, b"shared prompt", "text/plain", Some(later), now)?;
            Ok::<_, StoreError>(h)
        })
        .await
        .unwrap();
    let refs = |store: &Store| {
        store
            .get::<super::artifacts::Artifact>(&scope, &hash)
            .unwrap()
            .map(|a| a.refs)
    };
    assert_eq!(refs(&store), Some(2));
    let sweep = |store: &Store, scope: &TenantScope, at| {
        let (s, h) = (scope.clone(), hash.clone());
        let store = store.clone();
        async move {
            store
                .transact(move |tx: &mut Tx| tx.sweep_artifact(&s, &h, at))
                .await
                .unwrap()
        }
    };
    let s = scope.clone();
    store
        .transact(move |tx: &mut Tx| tx.delete::<Doc>(&s, "a"))
        .await
        .unwrap();
    assert_eq!(refs(&store), Some(1));
    assert!(!sweep(&store, &scope, later).await, "still referred to");
    let s = scope.clone();
    store
        .transact(move |tx: &mut Tx| tx.delete::<Doc>(&s, "b"))
        .await
        .unwrap();
    assert_eq!(refs(&store), Some(0));
    // No reference left: due at once, and listed in the sweep index.
    let due = store
        .index_range(
            &scope,
            super::artifacts::SWEEP_INDEX,
            None,
            Some(&time_value(now)),
            10,
        )
        .unwrap();
    assert_eq!(due.len(), 1);
    assert!(sweep(&store, &scope, now).await, "acme's record goes");
    assert!(store.read_artifact(&scope, &hash).unwrap().is_none());
    assert_eq!(
        store.read_artifact(&other, &hash).unwrap().as_deref(),
        Some(&b"shared prompt"[..])
    );
    // Globex's copy is unreferenced and expires with its retention.
    assert!(!sweep(&store, &other, now).await, "not expired yet");
    assert!(sweep(&store, &other, later).await);
    assert!(
        store.tree(Table::ArtifactChunks).unwrap().is_empty(),
        "content gone"
    );
    assert!(
        store
            .index_range(&other, super::artifacts::SWEEP_INDEX, None, None, 10)
            .unwrap()
            .is_empty()
    );
}

async fn backup_restores_every_record_and_file(dir: Place) {
    let store = dir.open();
    let scope = tenant("acme");
    let s = scope.clone();
    store
        .transact(move |tx: &mut Tx| {
            for i in 0..100 {
                tx.put(&s, &note(&s, &format!("n{i}"), "backed up"))?;
            }
            tx.emit(event(&s, "test.v1.noted"))
        })
        .await
        .unwrap();
    let path = dir.path().join("backup.agentbay");
    let out = std::fs::File::create(&path).unwrap();
    let summary = store
        .backup(out, vec![("tls/ca.pem".into(), b"PEM".to_vec())])
        .await
        .unwrap();
    assert_eq!(summary.files, 1);
    assert!(summary.records >= 101);

    let target = dir.path().join("restored");
    let restored = restore_into(&path, &target).unwrap();
    assert_eq!(restored, summary);
    assert_eq!(std::fs::read(target.join("tls/ca.pem")).unwrap(), b"PEM");
    let store2 = Store::open(&target.join("store"), &StoreOptions::default()).unwrap();
    assert_eq!(store2.list::<Note>(&scope).unwrap().len(), 100);
    assert_eq!(
        store2
            .events_after(&EventFilter::default(), 0, 10)
            .unwrap()
            .len(),
        1
    );

    // A non-empty target is refused; a damaged file leaves nothing behind.
    let err = restore_into(&path, &target).unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    let bytes = std::fs::read(&path).unwrap();
    let damaged = dir.path().join("damaged.agentbay");
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let target2 = dir.path().join("restored2");
    assert!(restore_into(&damaged, &target2).is_err());
    assert!(!target2.exists());
    assert!(!target2.with_extension("restoring").exists());
}

async fn pruned_events_never_give_their_numbers_away(dir: Place) {
    let scope = tenant("acme");
    {
        let store = dir.open();
        for _ in 0..5 {
            let s = scope.clone();
            store
                .transact(move |tx: &mut Tx| tx.emit(event(&s, "test.v1.noted")))
                .await
                .unwrap();
        }
        let pruned = store
            .prune_events(Utc::now() + chrono::Duration::seconds(1), 100)
            .await
            .unwrap();
        assert_eq!(pruned, 5);
        assert!(
            store
                .events_after(&EventFilter::default(), 0, 10)
                .unwrap()
                .is_empty()
        );
        store.close().unwrap();
    }
    let store = dir.open();
    let s = scope.clone();
    let seq = store
        .transact(move |tx: &mut Tx| tx.emit(event(&s, "test.v1.noted")))
        .await
        .unwrap();
    assert_eq!(seq, 6);
}

async fn artifacts_are_shared_by_hash_but_read_only_by_their_tenants(dir: Place) {
    let store = dir.open();
    let acme = tenant("acme");
    let bytes: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let (s, b) = (acme.clone(), bytes.clone());
    let hash = store
        .transact(move |tx: &mut Tx| {
            tx.put_artifact(&s, &b, "application/octet-stream", None, Utc::now())
        })
        .await
        .unwrap();
    assert_eq!(hash, crate::domain::content::content_hash(&bytes));
    assert_eq!(store.read_artifact(&acme, &hash).unwrap().unwrap(), bytes);
    // Another tenant does not see it until it stores the same bytes itself.
    let globex = tenant("globex");
    assert!(store.read_artifact(&globex, &hash).unwrap().is_none());
    let (s, b) = (globex.clone(), bytes.clone());
    store
        .transact(move |tx: &mut Tx| {
            tx.put_artifact(&s, &b, "application/octet-stream", None, Utc::now())
        })
        .await
        .unwrap();
    assert_eq!(
        store.read_artifact(&globex, &hash).unwrap().unwrap().len(),
        100_000
    );
    // Tampering with a chunk is detected on read.
    store.damage(
        Table::ArtifactChunks,
        &artifacts_chunk_key(&hash, 1),
        Some(&[0u8; 10]),
    );
    assert!(store.read_artifact(&acme, &hash).is_err());
}

fn artifacts_chunk_key(hash: &str, index: u32) -> Vec<u8> {
    let mut key = hash.as_bytes().to_vec();
    key.push(b'/');
    key.extend_from_slice(&index.to_be_bytes());
    key
}

async fn a_versioned_write_derived_from_an_older_version_is_refused_and_changes_nothing(
    dir: Place,
) {
    let store = dir.open();
    let acme = tenant("acme");
    let fresh = tally(&acme, "t");
    let v1 = save(&store, &acme, &fresh).await.unwrap();
    assert_eq!(v1.version, 1, "a new record is stored as version 1");
    // Creating it again from a new copy is refused: it exists.
    let again = save(&store, &acme, &fresh).await.unwrap_err();
    assert!(matches!(again, StoreError::Stale { .. }), "{again}");
    assert!(again.to_string().contains("version 1"), "{again}");

    let mut a = v1.clone();
    a.count = 5;
    let v2 = save(&store, &acme, &a).await.unwrap();
    assert_eq!(v2.version, 2);
    // A writer still holding version 1 cannot replace version 2.
    let mut stale = v1.clone();
    stale.count = 7;
    let err = save(&store, &acme, &stale).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Stale { .. }),
        "a stale write must fail loudly: {err}"
    );
    assert!(
        err.to_string().contains("derived from version 1") && err.to_string().contains("version 2"),
        "{err}"
    );
    assert_eq!(store.get::<Tally>(&acme, "t").unwrap().unwrap(), v2);
    // The writer reads again and succeeds from the current state.
    let mut current = store
        .get_latest::<Tally>(&acme, "t")
        .await
        .unwrap()
        .unwrap();
    current.count = 7;
    assert_eq!(save(&store, &acme, &current).await.unwrap().version, 3);
}

async fn a_write_that_breaks_a_successor_rule_is_refused_whoever_makes_it(dir: Place) {
    let store = dir.open();
    let acme = tenant("acme");
    let mut t = save(&store, &acme, &tally(&acme, "t")).await.unwrap();
    t.count = 3;
    t.done = true;
    let t = save(&store, &acme, &t).await.unwrap();
    let mut back = t.clone();
    back.done = false;
    let err = save(&store, &acme, &back).await.unwrap_err();
    assert!(matches!(err, StoreError::Invariant { .. }), "{err}");
    assert!(err.to_string().contains("stays finished"), "{err}");
    let mut down = t.clone();
    down.count = 2;
    let err = save(&store, &acme, &down).await.unwrap_err();
    assert!(err.to_string().contains("never goes down"), "{err}");
    assert_eq!(store.get::<Tally>(&acme, "t").unwrap().unwrap(), t);
}

async fn of_concurrent_writers_from_one_version_exactly_one_wins_even_within_one_group(dir: Place) {
    let store = dir.open();
    let acme = tenant("acme");
    let base = save(&store, &acme, &tally(&acme, "t")).await.unwrap();
    // Queued back to back, so they land in the same group: the later one
    // reads the earlier one's write through the group's overlay.
    let mut pending = Vec::new();
    for n in 1..=32u64 {
        let (scope, mut t) = (acme.clone(), base.clone());
        t.count = n;
        pending.push(store.submit(move |tx: &mut Tx| {
            tx.save(&scope, &mut t)?;
            Ok::<_, StoreError>(t)
        }));
    }
    let results = futures::future::join_all(pending).await;
    let won: Vec<&Tally> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(won.len(), 1, "one write from version 1 wins");
    assert!(
        results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| matches!(e, StoreError::Stale { .. }))
    );
    assert_eq!(won[0].count, 1, "the first in commit order");
    assert_eq!(store.get::<Tally>(&acme, "t").unwrap().unwrap(), *won[0]);
}

async fn get_latest_sees_a_queued_write_and_plain_reads_never_go_back(dir: Place) {
    let store = dir.open();
    let acme = tenant("acme");
    let mut t = save(&store, &acme, &tally(&acme, "t")).await.unwrap();
    // A write queued but not awaited: get_latest is ordered after it.
    t.count = 1;
    let (scope, queued) = (acme.clone(), t.clone());
    let write = store.submit(move |tx: &mut Tx| {
        let mut queued = queued;
        tx.save(&scope, &mut queued)?;
        Ok::<_, StoreError>(())
    });
    let latest = store
        .get_latest::<Tally>(&acme, "t")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((latest.count, latest.version), (1, 2));
    write.await.unwrap();

    // Readers on other threads never see a version older than one
    // acknowledged before their read began.
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(2));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (store, acme, acked, stop) =
                (store.clone(), acme.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    let floor = acked.load(std::sync::atomic::Ordering::Acquire);
                    let seen = store.get::<Tally>(&acme, "t").unwrap().unwrap().version;
                    assert!(
                        seen >= floor,
                        "read version {seen} after {floor} was acknowledged"
                    );
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let mut current = latest;
    for n in 2..200u64 {
        current.count = n;
        current = save(&store, &acme, &current).await.unwrap();
        acked.store(current.version, std::sync::atomic::Ordering::Release);
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
}

#[test]
fn a_database_reopened_as_soon_as_it_is_dropped_opens() {
    // sled releases its file lock a moment after the last handle is
    // dropped; a restore and a compaction reopen at once.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    for round in 0u32..40 {
        let db = super::open_sled(&path, None).unwrap();
        db.insert(round.to_be_bytes(), &b"x"[..]).unwrap();
        db.flush().unwrap();
    }
    let db = super::open_sled(&path, None).unwrap();
    assert_eq!(db.len(), 40);
}

#[test]
fn the_store_reopens_itself_under_concurrent_writes_and_reads_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        snapshot_every_bytes: 64 * 1024,
        sync_data: false,
        ..StoreOptions::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = Store::open(&dir.path().join("store"), &options).unwrap();
    let scope = tenant("acme");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Readers go on through every reopen; a read never fails.
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, scope, stop) = (store.clone(), scope.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    let page = store.list_page::<Note>(&scope, None, 50).unwrap();
                    for n in &page {
                        assert!(store.get::<Note>(&scope, &n.id).unwrap().is_some());
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let text = "x".repeat(2048);
    runtime.block_on(async {
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (store, scope, text) = (store.clone(), scope.clone(), text.clone());
                tokio::spawn(async move {
                    for i in 0..100 {
                        let n = note(&scope, &format!("{w}-{i:03}"), &text);
                        let s = scope.clone();
                        store
                            .transact(move |tx: &mut Tx| {
                                tx.put(&s, &n)?;
                                tx.emit(event(&s, "test.v1.noted"))
                            })
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.await.unwrap();
        }
    });
    stop.store(true, std::sync::atomic::Ordering::Release);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let reopens = store.commit_stats().reopens;
    assert!(
        reopens >= 5,
        "800 KiB written, a reopen every 64 KiB: {reopens}"
    );
    assert!(store.healthy().is_ok());
    assert_eq!(store.list::<Note>(&scope).unwrap().len(), 400);
    assert_eq!(store.events_head(), 400, "every event numbered once");
    store.close().unwrap();
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.list::<Note>(&scope).unwrap().len(), 400);
    assert_eq!(store.audit().unwrap(), Vec::<String>::new());
}

async fn submit_then_answers_once_durable_at_once_when_aborted_and_closed_after_close(dir: Place) {
    let store = dir.open();
    let acme = tenant("acme");
    let (answered, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let save_then = |label: &'static str, mut t: Tally| {
        let (scope, to) = (acme.clone(), answered.clone());
        store.submit_then(
            move |tx: &mut Tx| {
                tx.save(&scope, &mut t)?;
                Ok::<_, StoreError>(t.version)
            },
            move |result| to.send((label, result)).unwrap(),
        );
    };
    save_then("saved", tally(&acme, "t"));
    let (what, result) = answers.recv().await.unwrap();
    assert_eq!((what, result.unwrap()), ("saved", 1));
    // Answered after the flush: a plain read sees it.
    assert_eq!(store.get::<Tally>(&acme, "t").unwrap().unwrap().version, 1);

    save_then("stale", tally(&acme, "t"));
    let (what, result) = answers.recv().await.unwrap();
    assert_eq!(what, "stale");
    assert!(
        matches!(result, Err(StoreError::Stale { .. })),
        "{result:?}"
    );

    store.close().unwrap();
    let to = answered.clone();
    store.submit_then(
        |_: &mut Tx| Ok::<_, StoreError>(0),
        move |result| to.send(("closed", result)).unwrap(),
    );
    let (what, result) = answers.recv().await.unwrap();
    assert_eq!(what, "closed");
    assert!(matches!(result, Err(StoreError::Closed)), "{result:?}");
}

/// Environment of [`crash_child`]: the data directory, and the first
/// transaction number.
const CRASH_DIR: &str = "AGENTBAY_STORE_CRASH_DIR";
const CRASH_FROM: &str = "AGENTBAY_STORE_CRASH_FROM";

/// Transaction `i` of the crash test: a small new record, a large new one
/// (past the undo record's threshold), a large one over an older value
/// (in the redo record), and an event, all naming `i`.
fn crash_transaction(tx: &mut Tx, i: u64) -> Result<(), StoreError> {
    let scope = tenant("acme");
    tx.put(
        &scope,
        &note(&scope, &format!("small-{i:09}"), &i.to_string()),
    )?;
    let big = format!("{i} {}", "b".repeat(2 * redo::LARGE));
    tx.put(&scope, &note(&scope, &format!("big-{i:09}"), &big))?;
    let shared = format!("{i} {}", "s".repeat(redo::LARGE));
    tx.put(&scope, &note(&scope, &format!("shared-{}", i % 8), &shared))?;
    tx.emit(NewEvent {
        payload: serde_json::json!({ "i": i }),
        ..event(&scope, "test.v1.crashed")
    })?;
    Ok(())
}

/// The child side of [`a_kill_9_at_any_moment_leaves_every_group_whole`]:
/// 32 writers commit transactions until the process is killed, printing
/// `ack <i>` once each is durable.
#[test]
#[ignore = "run in a child process by a_kill_9_at_any_moment_leaves_every_group_whole"]
fn crash_child() {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    let (Ok(dir), Ok(from)) = (std::env::var(CRASH_DIR), std::env::var(CRASH_FROM)) else {
        return;
    };
    let next = Arc::new(AtomicU64::new(from.parse().unwrap()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = Store::open(std::path::Path::new(&dir), &StoreOptions::default()).unwrap();
        for _ in 0..32 {
            let (store, next) = (store.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = store
                        .transact(move |tx: &mut Tx| crash_transaction(tx, i))
                        .await
                    {
                        // The parent sees the output end.
                        eprintln!("transaction {i}: {e}");
                        std::process::exit(1);
                    }
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ack {i}").unwrap();
                    out.flush().unwrap();
                }
            });
        }
        // Until killed.
        std::future::pending::<()>().await;
    });
}

/// kill -9 of a process writing groups of transactions (each a small and a
/// large new record, a large overwrite and an event), at a different
/// moment each cycle, then a reopen: every acknowledged transaction is
/// there, and every transaction is there whole or not at all, in every
/// table. `AGENTBAY_STORE_CRASH_CYCLES` sets the cycles (default 24).
#[test]
fn a_kill_9_at_any_moment_leaves_every_group_whole() {
    use std::io::BufRead;
    let cycles: u64 = std::env::var("AGENTBAY_STORE_CRASH_CYCLES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(24);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let scope = tenant("acme");
    let mut acked_total = 0;
    for cycle in 0..cycles {
        let from = cycle * 1_000_000;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "store::tests::crash_child",
                "--ignored",
                "--nocapture",
            ])
            .env(CRASH_DIR, &path)
            .env(CRASH_FROM, from.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // A different moment each cycle: after 40 to 1,000 acknowledgements.
        let kill_after = 40 + (cycle * 397) % 960;
        let mut acked = BTreeSet::new();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        while acked.len() < kill_after as usize {
            let line = lines
                .next()
                .expect("the child writes until it is killed")
                .unwrap();
            if let Some(i) = line.strip_prefix("ack ") {
                acked.insert(i.parse::<u64>().unwrap());
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        // What the child printed before it died was acknowledged too.
        for line in lines {
            if let Some(i) = line.unwrap().strip_prefix("ack ") {
                acked.insert(i.parse::<u64>().unwrap());
            }
        }
        acked_total += acked.len();

        let store = Store::open(&path, &StoreOptions::default()).unwrap();
        let notes = store.list::<Note>(&scope).unwrap();
        let numbered = |prefix: &str| -> BTreeSet<u64> {
            notes
                .iter()
                .filter_map(|n| n.id.strip_prefix(prefix))
                .map(|i| i.parse::<u64>().unwrap())
                .filter(|i| *i >= from)
                .collect()
        };
        let small = numbered("small-");
        let big = numbered("big-");
        let events: BTreeSet<u64> = store
            .events_after(&EventFilter::default(), 0, usize::MAX)
            .unwrap()
            .iter()
            .filter(|e| e.topic == "test.v1.crashed")
            .map(|e| e.payload["i"].as_u64().unwrap())
            .filter(|i| *i >= from)
            .collect();
        let lost: Vec<_> = acked.difference(&small).collect();
        assert!(
            lost.is_empty(),
            "cycle {cycle}: acknowledged and lost: {lost:?}"
        );
        let torn = |other: &BTreeSet<u64>| -> Vec<u64> {
            small.symmetric_difference(other).copied().collect()
        };
        assert!(
            torn(&big).is_empty(),
            "cycle {cycle}: a large new record without the rest of its transaction, or the reverse: {:?}",
            torn(&big)
        );
        assert!(
            torn(&events).is_empty(),
            "cycle {cycle}: an event without the rest of its transaction, or the reverse: {:?}",
            torn(&events)
        );
        for n in notes.iter().filter(|n| n.id.starts_with("shared-")) {
            let i: u64 = n.text.split(' ').next().unwrap().parse().unwrap();
            assert_eq!(n.text, format!("{i} {}", "s".repeat(redo::LARGE)));
            assert!(
                i < from || small.contains(&i),
                "cycle {cycle}: {} holds transaction {i}, which did not survive",
                n.id
            );
        }
        for n in notes.iter().filter(|n| n.id.starts_with("big-")) {
            let i: u64 = n.id["big-".len()..].parse().unwrap();
            assert!(
                n.text == format!("{i} {}", "b".repeat(2 * redo::LARGE)),
                "cycle {cycle}: {} was cut",
                n.id
            );
        }
        store.close().unwrap();
    }
    assert!(acked_total > 0);
}

/// The audit trail: an audited event emitted on behalf of someone is a
/// record of the chain, in commit order, with the value it replaced; the
/// chain survives a restart, finds an edited record, and stays checkable
/// once retention removed its oldest records.
async fn the_audit_chain_follows_commit_order_and_finds_an_edit(dir: Place) {
    use crate::domain::audit::{AuditFilter, Change, Origin, Via};
    let store = dir.open();
    let origin = Origin {
        actor: "user wes".into(),
        address: "10.1.2.3".into(),
        via: Via::Console,
    };
    let t0 = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
    let quota = |runs: u32, at| NewEvent {
        topic: "capacity.quotas.v1.quota-changed",
        tenant_id: TenantId::parse("acme").unwrap(),
        occurred_at: at,
        payload: serde_json::json!({"tenantId": "acme", "concurrentRuns": runs}),
    };
    for (i, runs) in [4u32, 2, 1].into_iter().enumerate() {
        let at = t0 + chrono::Duration::days(i as i64);
        crate::acting::scope(
            origin.clone(),
            store.transact(move |tx| tx.emit(quota(runs, at)).map(|_| ())),
        )
        .await
        .unwrap();
    }
    // The appliance's own doing (no actor) is not an action.
    store
        .transact(move |tx| tx.emit(quota(9, t0)).map(|_| ()))
        .await
        .unwrap();
    // A change recorded where it happens, in another tenant.
    crate::acting::scope(
        origin.clone(),
        store.transact(move |tx| {
            let change = Change::new(&TenantId::parse("beta").unwrap(), "pool.set", "gpu")
                .before(serde_json::json!({"maxSize": 1}))
                .after(serde_json::json!({"maxSize": 2}));
            tx.audit(t0, change)
        }),
    )
    .await
    .unwrap();

    let acme = AuditFilter {
        tenant: Some(TenantId::parse("acme").unwrap()),
        ..AuditFilter::default()
    };
    let records = store.audit_page(&acme, None, 10).unwrap();
    assert_eq!(records.len(), 3, "{records:#?}");
    assert_eq!(
        records.iter().map(|r| r.sequence).collect::<Vec<_>>(),
        [3, 2, 1]
    );
    assert!(records.iter().all(|r| r.action == "quota.set"
        && r.actor == "user wes"
        && r.address == "10.1.2.3"
        && r.target == "acme"));
    assert_eq!(records[0].before.as_ref().unwrap()["concurrentRuns"], 2);
    assert_eq!(records[0].after.as_ref().unwrap()["concurrentRuns"], 1);
    assert!(records[2].before.is_none());
    let all = store.audit_page(&AuditFilter::default(), None, 10).unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(all[0].tenant_id.as_str(), "beta");

    let report = store.verify_audit(&Default::default()).unwrap();
    assert_eq!(
        (report.checked, report.first, report.last),
        (4, Some(1), Some(4))
    );
    assert!(report.broken.is_none());
    assert_eq!(report.head, all[0].hash);

    // Retention removes the two oldest; the rest still checks, from them.
    let removed = store
        .prune_audit(t0 + chrono::Duration::hours(36), 10)
        .await
        .unwrap();
    assert_eq!(removed, 2);
    let report = store.verify_audit(&Default::default()).unwrap();
    assert_eq!((report.checked, report.first), (2, Some(3)));
    assert!(report.broken.is_none(), "{:?}", report.broken);

    // The head survives a restart: the next record follows it.
    store.close().unwrap();
    drop(store);
    let store = dir.open();
    crate::acting::scope(
        origin.clone(),
        store.transact(move |tx| tx.emit(quota(3, t0)).map(|_| ())),
    )
    .await
    .unwrap();
    let report = store.verify_audit(&Default::default()).unwrap();
    assert_eq!((report.checked, report.last), (3, Some(5)));
    assert!(report.broken.is_none());

    // Cutting the start (the oldest kept record removed, the anchor
    // rewritten to it) leaves a chain that checks, with the same head: only
    // what was noted elsewhere finds the cut.
    let noted = crate::domain::audit::Expect {
        first: report.first,
        head: Some(
            store
                .audit_page(&AuditFilter::default(), None, 10)
                .unwrap()
                .iter()
                .find(|r| r.sequence == 4)
                .unwrap()
                .hash
                .clone(),
        ),
    };
    assert!(store.verify_audit(&noted).unwrap().unmet.is_empty());
    let anchor = store
        .tree(Table::Meta)
        .unwrap()
        .get(trail::PRUNED_THROUGH.as_bytes())
        .unwrap()
        .unwrap()
        .to_vec();
    let kept = |n: u64| {
        trail::decode(
            &store
                .tree(Table::Audit)
                .unwrap()
                .get(n.to_be_bytes())
                .unwrap()
                .unwrap(),
        )
        .unwrap()
    };
    // Removes a record and anchors the chain on it, as a cut would.
    let cut_through = |r: &crate::domain::audit::AuditRecord| {
        store.damage(Table::Audit, &r.sequence.to_be_bytes(), None);
        store.damage(
            Table::Meta,
            trail::PRUNED_THROUGH.as_bytes(),
            Some(&trail::anchor_value(r)),
        );
    };
    let third = kept(3);
    cut_through(&third);
    let cut = store.verify_audit(&Default::default()).unwrap();
    assert!(cut.broken.is_none() && cut.unmet.is_empty());
    assert_eq!(cut.head, report.head, "the head is unchanged");
    let found = store.verify_audit(&noted).unwrap();
    assert_eq!(found.unmet.len(), 1, "{:?}", found.unmet);
    assert!(
        found.unmet[0].contains("starts at record 4, later than the expected first record 3"),
        "{:?}",
        found.unmet
    );
    // Cutting through the noted head: it is found missing too.
    let fourth = kept(4);
    cut_through(&fourth);
    let found = store.verify_audit(&noted).unwrap();
    assert!(
        found.unmet.iter().any(|u| u.contains("noted earlier")),
        "{:?}",
        found.unmet
    );
    // Put back for what follows.
    for r in [&third, &fourth] {
        store.damage(
            Table::Audit,
            &r.sequence.to_be_bytes(),
            Some(&trail::encode(r).unwrap()),
        );
    }
    store.damage(Table::Meta, trail::PRUNED_THROUGH.as_bytes(), Some(&anchor));
    assert!(store.verify_audit(&noted).unwrap().unmet.is_empty());

    // An edit in place is found, at the record edited.
    let bytes = store
        .tree(Table::Audit)
        .unwrap()
        .get(4u64.to_be_bytes())
        .unwrap()
        .unwrap();
    let mut edited = trail::decode(&bytes).unwrap();
    edited.actor = "user mallory".into();
    store.damage(
        Table::Audit,
        &4u64.to_be_bytes(),
        Some(&trail::encode(&edited).unwrap()),
    );
    let report = store.verify_audit(&Default::default()).unwrap();
    let broken = report.broken.expect("the edit is found");
    assert_eq!(broken.sequence, 4);
    assert_eq!(report.checked, 1);
    assert!(
        broken.reason.contains("changed after it was written"),
        "{}",
        broken.reason
    );
}

#[test]
fn a_store_another_version_wrote_is_backed_up_once_before_it_is_changed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let backups = dir.path().join("backups");
    let with_backups = StoreOptions {
        upgrade_backup_dir: Some(backups.clone()),
        ..StoreOptions::default()
    };
    // A store this version made: no backup, whoever opens it again.
    let store = Store::open(&path, &with_backups).unwrap();
    store.close().unwrap();
    drop(store);
    let store = Store::open(&path, &with_backups).unwrap();
    store.close().unwrap();
    drop(store);
    assert!(!backups.exists(), "no upgrade, no backup");

    // As an earlier version left it: schema 7, written by 0.0.9.
    {
        let db = open_sled(&path, None).unwrap();
        let meta = db.open_tree(Table::Meta.name()).unwrap();
        meta.insert(schema::VERSION_KEY, &7u32.to_be_bytes())
            .unwrap();
        meta.insert(schema::WRITER_KEY, b"0.0.9").unwrap();
        db.flush().unwrap();
    }
    // Where the backup cannot be written, the store is not opened and the
    // error says where and why; nothing was migrated.
    let blocked = dir.path().join("a-file");
    std::fs::write(&blocked, b"").unwrap();
    let Err(err) = Store::open(
        &path,
        &StoreOptions {
            upgrade_backup_dir: Some(blocked.clone()),
            ..StoreOptions::default()
        },
    ) else {
        panic!("opened without a backup");
    };
    let text = err.to_string();
    assert!(text.contains("agentbay-0.0.9-schema-7"), "{text}");
    assert!(text.contains(&blocked.display().to_string()), "{text}");
    {
        let db = open_sled(&path, None).unwrap();
        let meta = db.open_tree(Table::Meta.name()).unwrap();
        assert_eq!(
            meta.get(schema::VERSION_KEY).unwrap().unwrap().as_ref(),
            7u32.to_be_bytes()
        );
    }

    let store = Store::open(&path, &with_backups).unwrap();
    assert_eq!(store.schema_version(), SCHEMA_VERSION);
    store.close().unwrap();
    drop(store);
    let taken: Vec<_> = std::fs::read_dir(&backups)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert!(
        taken[0].starts_with("before-upgrade-from-agentbay-0.0.9-schema-7-")
            && taken[0].ends_with(".backup"),
        "{taken:?}"
    );
    // It restores to the store as found: schema 7, by 0.0.9.
    let restored = dir.path().join("restored");
    let summary = restore_into(&backups.join(&taken[0]), &restored).unwrap();
    assert_eq!(summary.schema_version, 7);
    // Opened once more: this version is the last writer now.
    let store = Store::open(&path, &with_backups).unwrap();
    store.close().unwrap();
    assert_eq!(std::fs::read_dir(&backups).unwrap().count(), 1);
}
