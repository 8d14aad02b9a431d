//! Reading release bundles, defensively.
//!
//! A bundle is a directory or a gzip-compressed tar archive holding
//! `manifest.json`, `signature.json` and the content files, either at its
//! root or under one top-level directory. Whatever the source, the reader
//! accepts regular files only (no links, devices or pipes), paths that stay
//! inside the bundle, no duplicate paths, and sizes within the limits; it
//! counts decompressed bytes as it reads, so a compression bomb stops at the
//! limit. Every refusal names the path and the reason.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use crate::domain::release::check_path;

/// Where a bundle's files came from, and their bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bundle {
    /// Files by path relative to the bundle root.
    pub files: BTreeMap<String, Vec<u8>>,
}

/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";
/// The signature's file name.
pub const SIGNATURE: &str = "signature.json";

/// Size limits of a bundle.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// All files together, decompressed.
    pub max_bundle_bytes: u64,
    /// One file.
    pub max_file_bytes: u64,
    /// Number of files.
    pub max_files: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bundle_bytes: 32 * 1024 * 1024,
            max_file_bytes: 8 * 1024 * 1024,
            max_files: 1000,
        }
    }
}

/// A bundle that cannot be read, and why; `.1` when it is larger than a
/// limit allows (the upload is refused as too large).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BundleError(pub String, pub bool);

fn err(reason: impl Into<String>) -> BundleError {
    BundleError(reason.into(), false)
}

fn too_large(reason: impl Into<String>) -> BundleError {
    BundleError(reason.into(), true)
}

impl Bundle {
    fn add(
        &mut self,
        path: String,
        bytes: Vec<u8>,
        limits: &Limits,
        total: &mut u64,
    ) -> Result<(), BundleError> {
        check_path("path", &path).map_err(|e| err(format!("bundle entry {}", e.reason)))?;
        if bytes.len() as u64 > limits.max_file_bytes {
            return Err(err(format!(
                "file {path} is {} bytes; a bundle file may have at most {}",
                bytes.len(),
                limits.max_file_bytes
            )));
        }
        *total += bytes.len() as u64;
        if *total > limits.max_bundle_bytes {
            return Err(too_large(format!(
                "the bundle is larger than {} bytes (releases.max_bundle_bytes)",
                limits.max_bundle_bytes
            )));
        }
        if self.files.len() >= limits.max_files {
            return Err(err(format!(
                "the bundle has more than {} files",
                limits.max_files
            )));
        }
        if self.files.insert(path.clone(), bytes).is_some() {
            return Err(err(format!("file {path} appears twice in the bundle")));
        }
        Ok(())
    }

    /// Moves everything up one level when the bundle sits in a single
    /// top-level directory (what `tar czf bundle.tar.gz bundle/` makes).
    fn unwrap_top_directory(mut self) -> Bundle {
        if self.files.contains_key(MANIFEST) {
            return self;
        }
        let Some(first) = self
            .files
            .keys()
            .next()
            .and_then(|p| p.split_once('/'))
            .map(|(d, _)| d.to_string())
        else {
            return self;
        };
        let prefix = format!("{first}/");
        if !self.files.keys().all(|p| p.starts_with(&prefix)) {
            return self;
        }
        self.files = std::mem::take(&mut self.files)
            .into_iter()
            .map(|(p, b)| (p[prefix.len()..].to_string(), b))
            .collect();
        self
    }

    /// The bundle with its manifest signed by `pair` (its `signature.json`
    /// replaced): how the demo signs the example releases with the
    /// appliance's own demo key as it seeds them.
    pub fn signed(mut self, pair: &ring::signature::Ed25519KeyPair) -> Result<Bundle, BundleError> {
        let parsed = crate::releases::verify::parse_manifest(self.manifest()?)
            .map_err(|r| err(format!("{MANIFEST}: {}", r.reason)))?;
        let signature = crate::releases::signing::sign(pair, &parsed.canonical);
        let bytes =
            serde_json::to_vec_pretty(&signature).map_err(|e| err(format!("{SIGNATURE}: {e}")))?;
        self.files.insert(SIGNATURE.into(), bytes);
        Ok(self)
    }

    /// The manifest's bytes.
    pub fn manifest(&self) -> Result<&[u8], BundleError> {
        self.files
            .get(MANIFEST)
            .map(Vec::as_slice)
            .ok_or_else(|| err(format!("the bundle has no {MANIFEST} at its root")))
    }

    /// Reads a gzip-compressed tar archive.
    #[allow(clippy::too_many_lines)]
    pub fn from_archive(bytes: &[u8], limits: &Limits) -> Result<Bundle, BundleError> {
        if bytes.len() < 2 || bytes[0] != 0x1f || bytes[1] != 0x8b {
            return Err(err("not a gzip-compressed tar archive (.tar.gz)"));
        }
        // Decompressed bytes are capped: tar headers and padding add at most
        // one 512-byte block per file plus two, above the files' own bytes.
        let cap = limits.max_bundle_bytes + 512 * (limits.max_files as u64 + 2) + 1024 * 10;
        let capped = std::rc::Rc::new(std::cell::Cell::new(false));
        let decoder = Capped {
            inner: flate2::read::GzDecoder::new(bytes),
            left: cap,
            hit: capped.clone(),
        };
        let mut archive = tar::Archive::new(decoder);
        let mut bundle = Bundle::default();
        let mut total = 0u64;
        let over_cap = || {
            too_large(format!(
                "the archive decompresses to more than {cap} bytes (releases.max_bundle_bytes, {} bytes, plus tar headers for releases.max_files, {} files)",
                limits.max_bundle_bytes, limits.max_files
            ))
        };
        let damaged = |e: std::io::Error| {
            if capped.get() {
                over_cap()
            } else {
                err(format!("the archive is truncated or damaged: {e}"))
            }
        };
        for entry in archive.entries().map_err(damaged)? {
            let mut entry = entry.map_err(damaged)?;
            let raw_path = String::from_utf8(entry.path_bytes().into_owned())
                .map_err(|_| err("a bundle entry has a path that is not UTF-8"))?;
            let path = raw_path
                .trim_start_matches("./")
                .trim_end_matches('/')
                .to_string();
            let kind = entry.header().entry_type();
            if kind.is_dir() {
                if !path.is_empty() {
                    check_path("path", &path)
                        .map_err(|e| err(format!("bundle entry {}", e.reason)))?;
                }
                continue;
            }
            // Extended headers that tar tools write for long names and
            // attributes carry no file.
            if kind.is_pax_global_extensions()
                || kind.is_pax_local_extensions()
                || kind.is_gnu_longname()
            {
                continue;
            }
            if !kind.is_file() {
                let what = if kind.is_symlink() {
                    "a symbolic link"
                } else if kind.is_hard_link() {
                    "a hard link"
                } else if kind.is_character_special() || kind.is_block_special() {
                    "a device file"
                } else if kind.is_fifo() {
                    "a named pipe"
                } else {
                    "not a regular file"
                };
                return Err(err(format!(
                    "bundle entry {path:?} is {what}; only regular files are allowed"
                )));
            }
            let declared = entry.header().size().map_err(damaged)?;
            if declared > limits.max_file_bytes {
                return Err(err(format!(
                    "file {path} is {declared} bytes; a bundle file may have at most {}",
                    limits.max_file_bytes
                )));
            }
            let mut bytes = Vec::with_capacity(declared as usize);
            (&mut entry)
                .take(limits.max_file_bytes + 1)
                .read_to_end(&mut bytes)
                .map_err(damaged)?;
            if (bytes.len() as u64) < declared {
                if capped.get() {
                    return Err(over_cap());
                }
                return Err(err(format!("the archive is truncated inside {path}")));
            }
            bundle.add(path, bytes, limits, &mut total)?;
        }
        // What follows the archive's end still counts: a stream of zeros
        // ends a tar archive at once, and would decompress for ever.
        std::io::copy(&mut archive.into_inner(), &mut std::io::sink()).map_err(damaged)?;
        Ok(bundle.unwrap_top_directory())
    }

    /// Reads a directory.
    pub fn from_dir(dir: &Path, limits: &Limits) -> Result<Bundle, BundleError> {
        let mut bundle = Bundle::default();
        let mut total = 0u64;
        walk(dir, dir, &mut bundle, limits, &mut total)?;
        Ok(bundle.unwrap_top_directory())
    }

    /// Reads a bundle from a directory or a `.tar.gz` file.
    pub fn from_path(path: &Path, limits: &Limits) -> Result<Bundle, BundleError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
        if meta.is_dir() {
            Bundle::from_dir(path, limits)
        } else {
            if meta.len() > limits.max_bundle_bytes {
                return Err(err(format!(
                    "{} is {} bytes; a bundle may have at most {}",
                    path.display(),
                    meta.len(),
                    limits.max_bundle_bytes
                )));
            }
            let bytes = std::fs::read(path)
                .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
            Bundle::from_archive(&bytes, limits)
        }
    }

    /// Packs the bundle as a `.tar.gz` (files at the root).
    pub fn to_archive(&self) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut builder = tar::Builder::new(gz);
        for (path, bytes) in &self.files {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_cksum();
            builder
                .append_data(&mut header, path, bytes.as_slice())
                .expect("writing to memory");
        }
        builder
            .into_inner()
            .and_then(|gz| gz.finish())
            .expect("writing to memory")
    }
}

fn walk(
    root: &Path,
    dir: &Path,
    bundle: &mut Bundle,
    limits: &Limits,
    total: &mut u64,
) -> Result<(), BundleError> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| err(format!("cannot read {}: {e}", dir.display())))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let relative = path
            .strip_prefix(root)
            .expect("walked from the root")
            .to_string_lossy()
            .replace('\\', "/");
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| err(format!("cannot read {relative}: {e}")))?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            return Err(err(format!(
                "bundle entry {relative:?} is a symbolic link; only regular files are allowed"
            )));
        }
        if kind.is_dir() {
            walk(root, &path, bundle, limits, total)?;
        } else if kind.is_file() {
            if meta.len() > limits.max_file_bytes {
                return Err(err(format!(
                    "file {relative} is {} bytes; a bundle file may have at most {}",
                    meta.len(),
                    limits.max_file_bytes
                )));
            }
            let bytes =
                std::fs::read(&path).map_err(|e| err(format!("cannot read {relative}: {e}")))?;
            bundle.add(relative, bytes, limits, total)?;
        } else {
            return Err(err(format!(
                "bundle entry {relative:?} is a device file, pipe or socket; only regular files are allowed"
            )));
        }
    }
    Ok(())
}

/// A reader that stops after `left` bytes and remembers that it did, so
/// that hitting the cap is told apart from a truncated archive.
struct Capped<R> {
    inner: R,
    left: u64,
    hit: std::rc::Rc<std::cell::Cell<bool>>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One byte more than the cap means the archive is over it.
            let mut probe = [0u8; 1];
            if self.inner.read(&mut probe)? > 0 {
                self.hit.set(true);
                return Err(std::io::Error::other("decompression cap reached"));
            }
            return Ok(0);
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut b = tar::Builder::new(gz);
        for (path, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if *kind == tar::EntryType::Symlink {
                h.set_link_name("/etc/passwd").unwrap();
            }
            // Bypass the builder's own path checks: a hostile archive can
            // hold anything.
            let name = h.as_old_mut().name.as_mut();
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn an_archive_over_the_decompression_cap_names_the_cap() {
        let limits = Limits {
            max_bundle_bytes: 1_000,
            max_file_bytes: 1_000,
            max_files: 2,
        };
        // Directory entries add no file but decompressed bytes.
        let names: Vec<String> = (0..200).map(|i| format!("d{i}/")).collect();
        let entries: Vec<(&str, tar::EntryType, &[u8])> = names
            .iter()
            .map(|n| (n.as_str(), tar::EntryType::Directory, &b""[..]))
            .collect();
        let e = Bundle::from_archive(&archive(&entries), &limits).unwrap_err();
        assert!(
            e.0.contains("decompresses to more than")
                && e.0.contains("releases.max_bundle_bytes")
                && !e.0.contains("truncated"),
            "{}",
            e.0
        );
    }

    /// Zeros end a tar archive at once; they are counted all the same, and
    /// a stream of them past the cap is refused as too large, naming it.
    #[test]
    fn a_bomb_of_zeros_is_too_large_not_a_bundle_without_a_manifest() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..8 {
            gz.write_all(&zeros).unwrap();
        }
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 64 * 1024);
        let limits = Limits {
            max_bundle_bytes: 1 << 20,
            ..Limits::default()
        };
        let e = Bundle::from_archive(&bomb, &limits).unwrap_err();
        assert!(e.1, "{e}");
        assert!(e.0.contains("releases.max_bundle_bytes"), "{e}");
    }

    #[test]
    fn hostile_archives_are_refused_by_name() {
        let limits = Limits::default();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                archive(&[("../evil", tar::EntryType::Regular, b"x")]),
                "'..'",
            ),
            (
                archive(&[("/etc/cron.d/x", tar::EntryType::Regular, b"x")]),
                "absolute",
            ),
            (
                archive(&[("link", tar::EntryType::Symlink, b"")]),
                "symbolic link",
            ),
            (
                archive(&[("dev", tar::EntryType::Char, b"")]),
                "device file",
            ),
            (
                archive(&[
                    ("a", tar::EntryType::Regular, b"1"),
                    ("a", tar::EntryType::Regular, b"2"),
                ]),
                "twice",
            ),
            (b"plain text".to_vec(), "not a gzip"),
        ];
        for (bytes, expected) in cases {
            let e = Bundle::from_archive(&bytes, &limits).unwrap_err();
            assert!(e.0.contains(expected), "{expected}: {e}");
        }
        let good = archive(&[("manifest.json", tar::EntryType::Regular, b"{}")]);
        let e = Bundle::from_archive(&good[..good.len() / 2], &limits).unwrap_err();
        assert!(e.0.contains("truncated or damaged"), "{e}");
    }

    #[test]
    fn sizes_are_capped_while_reading() {
        let limits = Limits {
            max_bundle_bytes: 1000,
            max_file_bytes: 600,
            max_files: 3,
        };
        let big = vec![b'a'; 700];
        let e = Bundle::from_archive(&archive(&[("big", tar::EntryType::Regular, &big)]), &limits)
            .unwrap_err();
        assert!(e.0.contains("at most 600"), "{e}");
        let half = vec![b'a'; 500];
        let e = Bundle::from_archive(
            &archive(&[
                ("a", tar::EntryType::Regular, &half),
                ("b", tar::EntryType::Regular, &half),
                ("c", tar::EntryType::Regular, &half),
            ]),
            &limits,
        )
        .unwrap_err();
        assert!(e.0.contains("larger than 1000"), "{e}");
    }

    #[test]
    fn a_single_top_directory_is_unwrapped_and_round_trips() {
        let bytes = archive(&[
            ("bundle/manifest.json", tar::EntryType::Regular, b"{}"),
            ("bundle/skills/a.md", tar::EntryType::Regular, b"# a"),
        ]);
        let b = Bundle::from_archive(&bytes, &Limits::default()).unwrap();
        assert_eq!(b.manifest().unwrap(), b"{}");
        assert!(b.files.contains_key("skills/a.md"));
        let again = Bundle::from_archive(&b.to_archive(), &Limits::default()).unwrap();
        assert_eq!(again, b);
    }
}
