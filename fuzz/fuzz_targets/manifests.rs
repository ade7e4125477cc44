//! Static pod manifests from arbitrary bytes, as the file source reads them; an accepted pod can be accounted
//! for and placed with limits the kernel takes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nodewarden_sync::fuzzing::manifest(data));
