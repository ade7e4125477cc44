//! Every parser of a kernel file gets arbitrary bytes: none may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodewarden_resources as r;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = r::parse_limit(text);
    let _ = r::parse_u64(text);
    let _ = r::parse_cpu_max(text);
    let _ = r::parse_flat_keyed(text);
    let _ = r::parse_nested_keyed(text);
    let _ = r::parse_psi(text);
    let _ = r::parse_cpu_list_count(text);
    let _ = r::parse_loadavg_threads(text);
    let _ = r::parse_meminfo(text);
});
