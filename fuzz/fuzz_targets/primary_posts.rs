#![no_main]
//! The primary's posts: P1 for the sec_uid, then P2 pages.

use socialgate_fuzz::{calls, drive, provider};
use std::sync::OnceLock;

static PROVIDER: OnceLock<shortvideo_primary::Primary> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let provider = PROVIDER.get_or_init(provider);
    drive(provider, calls::posts(None), data);
});
