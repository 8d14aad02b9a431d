//! Applying a group of writes to several sled trees atomically, without
//! sled's transactions.
//!
//! A sled 0.34 transaction is atomic because of a process-wide lock: the
//! transaction takes it exclusively, and once any transaction has run,
//! every `flush` holds it shared while it writes the log and waits for the
//! disk. The store's writer and flusher would then take turns (see
//! `commit.rs`). Plain inserts take no such lock. So nothing in the
//! process runs a sled transaction or batch, `checksum` or `export`: one
//! of them would switch that lock on for good.
//!
//! So a group is written as plain inserts, made atomic by records in the
//! meta table. sled's log is replayed in order up to its first incomplete
//! message, so after a crash the operations of one thread are recovered
//! as a prefix of the order it made them in. The writer (the only thread
//! that writes) applies group `n` in this order:
//!
//! 1. the **undo record** of `n` (`undo/` keys), when the group writes
//!    large values (at least [`LARGE`] bytes) under keys the store does
//!    not hold yet: it names those keys, as removals;
//! 2. those large values, as plain inserts;
//! 3. the **redo record** of `n` (`redo/` keys): every other write of the
//!    group, encoded. Once it is whole the group is committed;
//! 4. those other writes, as plain inserts and removals.
//!
//! At open, [`replay`] reads both records back. A whole redo record is
//! applied again (each write is the key's final value, so applying it
//! twice changes nothing; and no later group's write can have been
//! recovered, since a later group writes its records first). A whole
//! undo record belongs to a group cut short before its commit when no
//! redo record of that group or a later one was begun, or that group's
//! own is not whole: its keys are removed (they were new, so nothing
//! older is lost). One older than the redo record begun last belongs to a
//! committed group and stays untouched: a group without large new values
//! writes no undo record, so one can outlive its group, even past a cut
//! redo record of a later group. An incomplete record means none of
//! what followed it was recovered. Then both records are removed, the
//! undo record first: a crash in between must not take a committed
//! group's undo record for a cut one.
//!
//! Large new values stay out of the redo record because copying them
//! would double the bytes sled logs for checkpoints and artifacts.
//!
//! A record is cut into chunks of at most [`CHUNK`] bytes: sled stores a
//! value of more than a quarter of its 512 KiB segment as a file of its
//! own. Each chunk carries the group's number and the number of chunks, so
//! a chunk left by an earlier, larger record is not taken for part of this
//! one: numbers grow while the database is open, and [`replay`] removes
//! every chunk when it opens.

use super::StoreError;
use super::tx::Writes;

/// Largest chunk of a redo record.
const CHUNK: usize = 64 * 1024;

/// Prefix of the redo record's keys in the meta table.
const REDO: &[u8] = b"redo/";

/// Prefix of the undo record's keys in the meta table.
const UNDO: &[u8] = b"undo/";

/// Values at least this long, under new keys, are inserted before the
/// redo record and named in the undo record instead of copied.
pub(super) const LARGE: usize = 512;

/// Bytes before a chunk's part of the record: group number, chunk count.
const HEADER: usize = 12;

fn chunk_key(prefix: &[u8], index: u32) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(&index.to_be_bytes());
    key
}

/// The writes as one byte string: per write, its table, key and value
/// (or none: a removal), lengths first.
fn encode<'a>(writes: impl Iterator<Item = (usize, &'a [u8], Option<&'a [u8]>)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (table, key, value) in writes {
        out.push(u8::try_from(table).expect("fewer than 256 tables"));
        out.extend_from_slice(&(key.len() as u32).to_be_bytes());
        out.extend_from_slice(key);
        match value {
            Some(v) => {
                out.push(1);
                out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                out.extend_from_slice(v);
            }
            None => out.push(0),
        }
    }
    out
}

fn decode(mut bytes: &[u8]) -> Result<Vec<Op>, String> {
    fn take<'b>(bytes: &mut &'b [u8], n: usize) -> Result<&'b [u8], String> {
        if bytes.len() < n {
            return Err(format!("{n} bytes wanted, {} left", bytes.len()));
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Ok(head)
    }
    fn length(bytes: &mut &[u8]) -> Result<usize, String> {
        let raw = take(bytes, 4)?;
        Ok(u32::from_be_bytes(raw.try_into().expect("4 bytes")) as usize)
    }
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let table = take(&mut bytes, 1)?[0] as usize;
        let n = length(&mut bytes)?;
        let key = take(&mut bytes, n)?.to_vec();
        let value = match take(&mut bytes, 1)?[0] {
            0 => None,
            1 => {
                let n = length(&mut bytes)?;
                Some(take(&mut bytes, n)?.to_vec())
            }
            other => return Err(format!("unknown write kind {other}")),
        };
        out.push((table, key, value));
    }
    Ok(out)
}

/// One sled write of a group, in the order it is made: table position,
/// key, value (`None`: a removal).
type Op = (usize, Vec<u8>, Option<Vec<u8>>);

/// A group's sled writes in order; readers must not run from
/// `visible_from` on until the last is made.
struct Plan {
    ops: Vec<Op>,
    visible_from: usize,
}

/// Orders group `group`'s writes as the module describes (`meta`: the
/// meta table's position).
fn plan(trees: &[sled::Tree], meta: usize, group: u64, writes: Writes) -> Result<Plan, StoreError> {
    let mut fresh = Vec::new();
    for (table, key, value) in writes.iter() {
        if value.as_ref().is_some_and(|v| v.len() >= LARGE) && !trees[table].contains_key(key)? {
            fresh.push((table, key.to_vec()));
        }
    }
    let mut rest = writes;
    let fresh: Vec<Op> = fresh
        .into_iter()
        .map(|(table, key)| {
            let value = rest.take(table, &key);
            (table, key, value)
        })
        .collect();
    let mut ops = Vec::new();
    if !fresh.is_empty() {
        let removals = fresh
            .iter()
            .map(|(table, key, _)| (*table, key.as_slice(), None));
        ops.extend(record(meta, UNDO, group, removals));
    }
    let redo = record(
        meta,
        REDO,
        group,
        rest.iter()
            .map(|(table, key, value)| (table, key, value.as_deref())),
    );
    let visible_from = if fresh.is_empty() {
        ops.len() + redo.len()
    } else {
        ops.len()
    };
    ops.extend(fresh);
    ops.extend(redo);
    ops.extend(rest.into_writes());
    Ok(Plan { ops, visible_from })
}

/// Applies group `group` (numbers must grow from one call to the next
/// until the database is opened again) to `trees` (indexed by table
/// position; `meta` is the meta table's), in the order the module
/// describes; `whole` is held from the first write a reader could see
/// to the last. Once it returns, a crash at any moment leaves all of the
/// writes or none after [`replay`].
pub(super) fn apply<G>(
    trees: &[sled::Tree],
    meta: usize,
    group: u64,
    writes: Writes,
    whole: impl FnOnce() -> G,
) -> Result<(), StoreError> {
    let Plan { ops, visible_from } = plan(trees, meta, group, writes)?;
    let mut whole = Some(whole);
    let mut _held = None;
    for (i, (table, key, value)) in ops.into_iter().enumerate() {
        if i == visible_from {
            _held = whole.take().map(|f| f());
        }
        match value {
            Some(v) => trees[table].insert(key, v)?,
            None => trees[table].remove(key)?,
        };
    }
    Ok(())
}

/// The writes of the record under `prefix` of group `group`, in chunks.
fn record<'a>(
    meta: usize,
    prefix: &[u8],
    group: u64,
    writes: impl Iterator<Item = (usize, &'a [u8], Option<&'a [u8]>)>,
) -> Vec<Op> {
    let record = encode(writes);
    let chunks: Vec<&[u8]> = if record.is_empty() {
        vec![&[]]
    } else {
        record.chunks(CHUNK).collect()
    };
    let count = chunks.len() as u32;
    chunks
        .iter()
        .enumerate()
        .map(|(index, part)| {
            let mut value = Vec::with_capacity(HEADER + part.len());
            value.extend_from_slice(&group.to_be_bytes());
            value.extend_from_slice(&count.to_be_bytes());
            value.extend_from_slice(part);
            (meta, chunk_key(prefix, index as u32), Some(value))
        })
        .collect()
}

/// A record read back: the group of its first chunk, its group and writes
/// when it is whole, and the keys of its chunks.
struct Found {
    first: Option<u64>,
    whole: Option<(u64, Vec<Op>)>,
    keys: Vec<sled::IVec>,
}

fn read_record(meta: &sled::Tree, prefix: &[u8]) -> Result<Found, StoreError> {
    let name = String::from_utf8_lossy(prefix).into_owned();
    let corrupt = |key: &[u8], reason: String| StoreError::Corrupt {
        table: "meta",
        key: String::from_utf8_lossy(key).into_owned(),
        reason: format!("{name} record: {reason}"),
    };
    let mut chunks = Vec::new();
    let mut keys = Vec::new();
    for item in meta.scan_prefix(prefix) {
        let (key, value) = item?;
        let index: [u8; 4] = key[prefix.len()..]
            .try_into()
            .map_err(|_| corrupt(&key, "the key is not a chunk number".into()))?;
        if value.len() < HEADER {
            return Err(corrupt(&key, "the chunk is shorter than its header".into()));
        }
        let group = u64::from_be_bytes(value[..8].try_into().expect("8 bytes"));
        let count = u32::from_be_bytes(value[8..12].try_into().expect("4 bytes"));
        chunks.push((u32::from_be_bytes(index), group, count, value));
        keys.push(key);
    }
    let mut whole = None;
    let first = match chunks.first() {
        Some(&(0, group, _, _)) => Some(group),
        _ => None,
    };
    if let Some(&(0, group, count, _)) = chunks.first() {
        let parts: Vec<&[u8]> = chunks
            .iter()
            .take(count as usize)
            .enumerate()
            .filter(|(i, (index, g, c, _))| *index as usize == *i && *g == group && *c == count)
            .map(|(_, (_, _, _, value))| &value[HEADER..])
            .collect();
        if parts.len() == count as usize {
            let writes = decode(&parts.concat())
                .map_err(|reason| corrupt(prefix, format!("group {group}: {reason}")))?;
            whole = Some((group, writes));
        }
    }
    Ok(Found { first, whole, keys })
}

/// Completes the last group a crash may have left committed but not
/// applied, or removes what a group cut before its commit inserted, then
/// removes both records. Runs at open, before anything reads. Returns how
/// many keys it changed: 0 when nothing was left unfinished (a clean stop
/// leaves the last group's redo record, whose writes are all in place), or
/// nothing of it was recovered.
pub(super) fn replay(trees: &[sled::Tree], meta: &sled::Tree) -> Result<usize, StoreError> {
    let redo = read_record(meta, REDO)?;
    let undo = read_record(meta, UNDO)?;
    // The undo record's group committed once its redo record was whole,
    // and for certain once a later group began its own redo record: a
    // group without new large values leaves the undo record of an earlier,
    // committed one in place.
    let redo_whole = redo.whole.as_ref().map(|(group, _)| *group);
    let cut = |group: u64| match redo.first {
        None => true,
        Some(first) => first < group || (first == group && redo_whole != Some(group)),
    };
    let mut todo = Vec::new();
    if let Some((_, writes)) = redo.whole {
        todo.extend(writes);
    }
    if let Some((group, removals)) = undo.whole
        && cut(group)
    {
        todo.extend(removals);
    }
    let mut changed = 0;
    for (table, key, value) in &todo {
        let tree = trees.get(*table).ok_or_else(|| StoreError::Corrupt {
            table: "meta",
            key: "redo/".into(),
            reason: format!("a record names table {table}, which this store does not have"),
        })?;
        let before = match value {
            Some(v) => tree.insert(key, v.as_slice())?,
            None => tree.remove(key)?,
        };
        if before.as_deref() != value.as_deref() {
            changed += 1;
        }
    }
    for key in undo.keys.into_iter().chain(redo.keys) {
        meta.remove(key)?;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const META: usize = 2;

    fn open() -> (sled::Db, Vec<sled::Tree>) {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let trees = ["a", "b", "meta"]
            .iter()
            .map(|n| db.open_tree(n).unwrap())
            .collect();
        (db, trees)
    }

    /// Everything but the meta table.
    fn contents(trees: &[sled::Tree]) -> BTreeMap<(usize, Vec<u8>), Vec<u8>> {
        trees[..META]
            .iter()
            .enumerate()
            .flat_map(|(t, tree)| {
                tree.iter()
                    .map(move |kv| kv.map(|(k, v)| ((t, k.to_vec()), v.to_vec())))
            })
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Large values under keys 0..40: new the first time (an undo record),
    /// overwritten the second (a redo record of several chunks).
    fn large(fill: u8) -> Writes {
        let mut writes = Writes::default();
        for i in 0..40u32 {
            writes.insert(
                (i % 2) as usize,
                i.to_be_bytes().to_vec(),
                Some(vec![fill; 5 * 1024]),
            );
        }
        writes.insert(0, b"small".to_vec(), Some(b"one".to_vec()));
        writes.insert(1, b"gone".to_vec(), Some(b"here".to_vec()));
        writes
    }

    /// Groups 1 and 2, whose records are larger than group 3's.
    fn earlier(t: &[sled::Tree]) {
        apply(t, META, 1, large(1), || ()).unwrap();
        apply(t, META, 2, large(2), || ()).unwrap();
        assert!(read_record(&t[META], REDO).unwrap().keys.len() > 3);
    }

    /// Group 3: new large values (undo record), a large value over an old
    /// one and small writes (redo record), removals.
    fn third() -> Writes {
        let mut writes = Writes::default();
        for i in 100..104u32 {
            writes.insert(0, i.to_be_bytes().to_vec(), Some(vec![2; 3 * 1024]));
        }
        writes.insert(1, 1u32.to_be_bytes().to_vec(), Some(vec![2; 4 * 1024]));
        writes.insert(0, b"small".to_vec(), Some(b"two".to_vec()));
        writes.insert(0, b"new small".to_vec(), Some(b"two".to_vec()));
        writes.insert(1, b"gone".to_vec(), None);
        writes.insert(0, 2u32.to_be_bytes().to_vec(), None);
        writes
    }

    #[test]
    fn a_crash_after_any_write_of_a_group_leaves_all_of_it_or_none() {
        let (_db, t) = open();
        earlier(&t);
        let plan = plan(&t, META, 3, third()).unwrap();
        let undo = plan
            .ops
            .iter()
            .filter(|(table, key, _)| *table == META && key.starts_with(UNDO))
            .count();
        assert_eq!(undo, 1, "the four new large values are named, not copied");
        assert_eq!(
            plan.visible_from, undo,
            "readers wait from the first new value on"
        );
        let committed = 1 + plan
            .ops
            .iter()
            .rposition(|(table, key, _)| *table == META && key.starts_with(REDO))
            .unwrap();
        let redo_bytes: usize = plan.ops[..committed]
            .iter()
            .filter(|(table, key, _)| *table == META && key.starts_with(REDO))
            .map(|(_, _, v)| v.as_ref().map_or(0, Vec::len))
            .sum();
        assert!(
            redo_bytes > 4 * 1024 && redo_bytes < 5 * 1024,
            "the overwritten large value is in the redo record, the new ones are not: {redo_bytes}"
        );

        every_cut(third);
    }

    /// A crash after each prefix of group 3's writes, with the records of
    /// groups 1 and 2 still in place as they would be: the tables hold
    /// what they held before group 3 until its redo record is whole, and
    /// what they hold after it from then on.
    fn every_cut(group: fn() -> Writes) {
        let (_db, t) = open();
        earlier(&t);
        let before = contents(&t);
        apply(&t, META, 3, group(), || ()).unwrap();
        let after = contents(&t);
        assert_ne!(before, after);

        let (_db, t) = open();
        earlier(&t);
        let plan = plan(&t, META, 3, group()).unwrap();
        let committed = 1 + plan
            .ops
            .iter()
            .rposition(|(table, key, _)| *table == META && key.starts_with(REDO))
            .unwrap();
        for cut in 0..=plan.ops.len() {
            let (_db, t) = open();
            earlier(&t);
            for (table, key, value) in &plan.ops[..cut] {
                match value {
                    Some(v) => t[*table].insert(key, v.as_slice()).unwrap(),
                    None => t[*table].remove(key).unwrap(),
                };
            }
            let changed = replay(&t, &t[META]).unwrap();
            if cut == plan.ops.len() {
                // A clean stop: the last group's record is left, and all
                // of its writes are in place.
                assert_eq!(changed, 0, "a group applied whole has nothing to complete");
            } else if cut == committed {
                assert!(
                    changed > 0,
                    "a committed group none of whose writes were applied"
                );
            }
            let expected = if cut >= committed { &after } else { &before };
            assert!(
                contents(&t) == *expected,
                "cut after {cut} of {} writes (committed at {committed})",
                plan.ops.len()
            );
            assert!(t[META].is_empty(), "both records are removed");
            assert_eq!(
                replay(&t, &t[META]).unwrap(),
                0,
                "and nothing is left to do"
            );
        }
    }

    #[test]
    fn a_cut_redo_record_never_takes_an_earlier_committed_groups_new_values_back() {
        // Group 1 wrote new large values (its undo record); group 2 only
        // overwrote them, so group 1's undo record is still there. Group 3
        // overwrites them again: a redo record of several chunks, which a
        // crash can cut after its first.
        let (_db, t) = open();
        earlier(&t);
        assert_eq!(read_record(&t[META], UNDO).unwrap().whole.unwrap().0, 1);
        let plan = plan(&t, META, 3, large(3)).unwrap();
        let chunks = plan
            .ops
            .iter()
            .filter(|(table, key, _)| *table == META && key.starts_with(REDO))
            .count();
        assert!(chunks > 1, "{chunks} chunks");
        every_cut(|| large(3));
    }

    #[test]
    fn a_crash_between_removing_the_records_keeps_a_committed_group() {
        let (_db, t) = open();
        earlier(&t);
        apply(&t, META, 3, third(), || ()).unwrap();
        let after = contents(&t);
        // The undo record is removed first; a crash right after it.
        for key in read_record(&t[META], UNDO).unwrap().keys {
            t[META].remove(key).unwrap();
        }
        replay(&t, &t[META]).unwrap();
        assert!(contents(&t) == after);
    }

    #[test]
    fn a_cut_or_foreign_record_is_refused_or_ignored() {
        assert_eq!(decode(&encode(std::iter::empty())).unwrap().len(), 0);
        assert!(
            decode(&[0, 0, 0, 0, 5, 1]).is_err(),
            "a cut record is refused"
        );
        let (_db, t) = open();
        t[META].insert(b"redo/x", b"not a chunk").unwrap();
        let err = replay(&t, &t[META]).unwrap_err().to_string();
        assert!(err.contains("redo/"), "{err}");
    }
}
