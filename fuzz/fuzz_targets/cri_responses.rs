//! A CRI runtime's answers (container status, sandbox status, Status, ListImages) as protobuf bytes, read as
//! nodewarden reads them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nodewarden_runtime::fuzzing::cri_response(data));
