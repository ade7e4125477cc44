//! Go durations as the config's duration fields are written: a duration or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = nodewarden_config::duration::parse(text);
});
