//! The store's own suite: what any future backend behind the facade must
//! pass too.

use std::collections::BTreeSet;

use chrono::Utc;
use serde::{Deserialize, Serialize};

use super::*;
use crate::domain::events::NewEvent;

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

fn event(scope: &TenantScope, topic: &'static str) -> NewEvent {
    NewEvent {
        topic,
        tenant_id: scope.tenant().clone(),
        occurred_at: Utc::now(),
        payload: serde_json::json!({"n": 1}),
    }
}

#[tokio::test]
async fn records_are_read_back_only_under_their_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
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

#[tokio::test]
async fn a_write_under_another_tenants_scope_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let acme = tenant("acme");
    let sneaky = note(&tenant("globex"), "x", "mine now");
    let err = store
        .transact(move |tx: &mut Tx| tx.put(&acme, &sneaky))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TenantMismatch { .. }), "{err}");
    assert!(store.list::<Note>(&tenant("globex")).unwrap().is_empty());
}

#[tokio::test]
async fn an_aborted_transaction_writes_nothing_and_numbers_no_event() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
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

#[tokio::test]
async fn events_are_numbered_in_commit_order_across_concurrent_writers() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
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

#[tokio::test]
async fn acknowledged_writes_and_sequences_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
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
    let store = open(dir.path());
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

#[tokio::test]
async fn older_record_versions_are_upgraded_and_newer_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
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
    store.tree(Table::Clients).insert("acme/old", old).unwrap();
    let mut newer = 9u16.to_be_bytes().to_vec();
    newer.extend_from_slice(b"whatever");
    store
        .tree(Table::Clients)
        .insert("acme/new", newer)
        .unwrap();

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

#[tokio::test]
async fn oversized_records_are_refused_with_the_limit_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let scope = tenant("acme");
    let big = note(&scope, "big", &"x".repeat(MAX_RECORD_BYTES));
    let err = store
        .transact(move |tx: &mut Tx| tx.put(&scope, &big))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("65536"), "{err}");
}

#[tokio::test]
async fn pages_continue_after_the_last_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
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

#[tokio::test]
async fn projections_read_some_fields_and_newest_stops_at_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let scope = tenant("acme");
    let other = tenant("acmecorp");
    let (s, o) = (scope.clone(), other.clone());
    store
        .transact(move |tx: &mut Tx| {
            for i in 0..10 {
                let text = if i % 2 == 0 { "even" } else { "odd" };
                tx.put(&s, &note(&s, &format!("n{i:02}"), text))?;
            }
            tx.put(&o, &note(&o, "n99", "even"))?;
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
    // A v1 record is upgraded before it is projected.
    let mut old = 1u16.to_be_bytes().to_vec();
    rmp_serde::encode::write_named(
        &mut old,
        &serde_json::json!({"tenant": "acme", "id": "n10", "body": "even"}),
    )
    .unwrap();
    store.tree(Table::Clients).insert("acme/n10", old).unwrap();

    #[derive(Deserialize)]
    struct Text {
        text: String,
    }
    let texts: Vec<Text> = store.list_projected::<Note, Text>(&scope).unwrap();
    assert_eq!(
        texts.len(),
        11,
        "only the scope's tenant, whose name prefixes another's"
    );
    assert_eq!(texts[10].text, "even");

    let newest: Vec<Note> = store
        .newest::<Note, Text>(&scope, 3, |t| t.text == "even")
        .unwrap();
    let ids: Vec<&str> = newest.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(ids, ["n10", "n08", "n06"]);
}

#[tokio::test]
async fn backup_restores_every_record_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
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

#[tokio::test]
async fn pruned_events_never_give_their_numbers_away() {
    let dir = tempfile::tempdir().unwrap();
    let scope = tenant("acme");
    {
        let store = open(dir.path());
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
    let store = open(dir.path());
    let s = scope.clone();
    let seq = store
        .transact(move |tx: &mut Tx| tx.emit(event(&s, "test.v1.noted")))
        .await
        .unwrap();
    assert_eq!(seq, 6);
}

#[tokio::test]
async fn artifacts_are_shared_by_hash_but_read_only_by_their_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let acme = tenant("acme");
    let bytes: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let (s, b) = (acme.clone(), bytes.clone());
    let hash = store
        .transact(move |tx: &mut Tx| {
            tx.put_artifact(&s, &b, "application/octet-stream", None, Utc::now())
        })
        .await
        .unwrap();
    assert_eq!(hash, artifacts::content_hash(&bytes));
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
    store
        .tree(Table::ArtifactChunks)
        .insert(artifacts_chunk_key(&hash, 1), vec![0u8; 10])
        .unwrap();
    assert!(store.read_artifact(&acme, &hash).is_err());
}

fn artifacts_chunk_key(hash: &str, index: u32) -> Vec<u8> {
    let mut key = hash.as_bytes().to_vec();
    key.push(b'/');
    key.extend_from_slice(&index.to_be_bytes());
    key
}
