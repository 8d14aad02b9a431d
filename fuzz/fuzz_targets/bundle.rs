//! Arbitrary bytes as a release bundle archive: reading must refuse or
//! accept, never panic, hang or exceed its limits; whatever it accepts goes
//! through every verification check.
#![no_main]

use agentbay::releases::bundle::{Bundle, Limits};
use agentbay::releases::signing::TrustedKey;
use agentbay::releases::verify::verify;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_bundle_bytes: 1 << 20,
        max_file_bytes: 256 << 10,
        max_files: 64,
    };
    if let Ok(bundle) = Bundle::from_archive(data, &limits) {
        let total: usize = bundle.files.values().map(Vec::len).sum();
        assert!(total as u64 <= limits.max_bundle_bytes);
        let _ = verify(&bundle, &[TrustedKey::demo()]);
    }
});
