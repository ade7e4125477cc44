//! `$(VAR)` expansion of commands, arguments and values: one pass, text without a reference unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    nodewarden_sync::fuzzing::expand(text);
});
