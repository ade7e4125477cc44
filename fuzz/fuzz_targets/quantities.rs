//! Quantities and amounts from arbitrary text: parsing and conversion may fail but never panic or overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodewarden_resources as r;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(q) = r::Quantity::parse(text) {
        let _ = q.value();
        let _ = q.milli_value();
    }
    let _ = r::parse_non_negative(text);
    let _ = r::parse_millicores(text);
    if let Ok(a) = r::Amount::parse(text) {
        let _ = a.resolve(u64::MAX);
        let _ = a.resolve(0);
    }
});
