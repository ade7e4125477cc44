//! The config file from arbitrary text: an error or a config, never a panic. A config that loads reloads from
//! the same text unchanged with nothing needing a restart, and its effective config, as `check-config` prints
//! it, loads again as the same config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodewarden_config as config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = config::duration::parse(text);
    let Ok(c) = config::parse(text) else { return };
    let r = config::reload(&c, text).expect("a file that loads reloads");
    assert!(r.needs_restart.is_empty(), "{:?}", r.needs_restart);
    assert!(r.config == c, "a reload of the same file changed the config");
    let printed = c.to_yaml();
    let again = config::parse(&printed).unwrap_or_else(|e| panic!("the printed config does not load: {e}\n{printed}"));
    // The printed form holds the implemented fields only: the ignored ones, and what was said of them, go.
    let again = config::Config { ignored: c.ignored.clone(), warnings: c.warnings.clone(), ..again };
    assert!(again == c, "the printed config loads as another config:\n{printed}");
});
