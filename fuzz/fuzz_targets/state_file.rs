//! A pod's state file and terminal record as a restarted daemon reads them: what was read, written again,
//! reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nodewarden_sync::fuzzing::state_file(data));
