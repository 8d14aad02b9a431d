//! Arbitrary bytes as manifest.json: parsed and validated or refused with a
//! reason, never a panic; what parses has a stable canonical form.
#![no_main]

use agentbay::releases::verify::parse_manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(parsed) = parse_manifest(data) {
        let again = parse_manifest(&parsed.canonical).expect("the canonical form parses");
        assert_eq!(again.canonical, parsed.canonical);
        assert_eq!(again.manifest_hash, parsed.manifest_hash);
    }
});
