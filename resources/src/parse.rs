//! Parsers for the kernel's cgroup and `/proc` file formats. They never panic: every malformed input becomes an
//! error that says which line and why, so a parser can be pointed at anything the kernel (or a fuzzer) produces.

use std::collections::BTreeMap;
use std::fmt;

/// A limit that is either a number or the kernel's `max` (no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Limit {
    /// A bounded value.
    Value(u64),
    /// No limit (`max`).
    Max,
}

impl Limit {
    /// The bounded value, or `None` for `max`.
    pub fn value(self) -> Option<u64> {
        match self {
            Limit::Value(v) => Some(v),
            Limit::Max => None,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Value(v) => write!(f, "{v}"),
            Limit::Max => f.write_str("max"),
        }
    }
}

/// Parses a single-value file holding a number or `max` (`memory.max`, `pids.max`, `memory.high`).
pub fn parse_limit(text: &str) -> Result<Limit, String> {
    let t = text.trim();
    if t == "max" {
        return Ok(Limit::Max);
    }
    parse_u64(t).map(Limit::Value)
}

/// Parses a single unsigned number (`memory.current`, `pids.current`, `cpu.weight`, `/proc/sys/kernel/pid_max`).
pub fn parse_u64(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.parse::<u64>().map_err(|e| format!("expected a number, found {:?}: {e}", shorten(t)))
}

/// The content of `cpu.max`: a quota in microseconds (or none) per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CpuMax {
    /// Microseconds of CPU time per period, or `None` for `max`.
    pub quota: Option<u64>,
    /// The period in microseconds.
    pub period: u64,
}

impl fmt::Display for CpuMax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.quota {
            Some(q) => write!(f, "{q} {}", self.period),
            None => write!(f, "max {}", self.period),
        }
    }
}

/// Parses `cpu.max` (`"max 100000"` or `"50000 100000"`).
pub fn parse_cpu_max(text: &str) -> Result<CpuMax, String> {
    let mut it = text.split_whitespace();
    let (Some(q), Some(p), None) = (it.next(), it.next(), it.next()) else {
        return Err(format!("expected \"QUOTA PERIOD\", found {:?}", shorten(text.trim())));
    };
    let quota = if q == "max" { None } else { Some(parse_u64(q)?) };
    Ok(CpuMax { quota, period: parse_u64(p)? })
}

/// Parses a flat keyed file, one `key value` pair a line (`memory.stat`, `memory.events`, `pids.events`,
/// `cpu.stat`). Blank lines are skipped; a line without a numeric value is an error.
pub fn parse_flat_keyed(text: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let mut it = line.split_whitespace();
        let Some(key) = it.next() else { continue };
        let (Some(value), None) = (it.next(), it.next()) else {
            return Err(format!("line {}: expected \"KEY VALUE\", found {:?}", n + 1, shorten(line)));
        };
        let value = parse_u64(value).map_err(|e| format!("line {}: {e}", n + 1))?;
        out.insert(key.to_owned(), value);
    }
    Ok(out)
}

/// The lines of a nested keyed file: each key with its `sub=value` fields.
pub type NestedKeyed = Vec<(String, BTreeMap<String, String>)>;

/// Parses a nested keyed file, `key sub=value sub=value ...` a line (`io.stat`, PSI files). Values stay strings.
pub fn parse_nested_keyed(text: &str) -> Result<NestedKeyed, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut it = line.split_whitespace();
        let Some(key) = it.next() else { continue };
        let mut fields = BTreeMap::new();
        for pair in it {
            let Some((k, v)) = pair.split_once('=') else {
                return Err(format!("line {}: expected SUB=VALUE, found {:?}", n + 1, shorten(pair)));
            };
            fields.insert(k.to_owned(), v.to_owned());
        }
        out.push((key.to_owned(), fields));
    }
    Ok(out)
}

/// One line of a PSI file: the share of wall time stalled over 10, 60 and 300 s (percent) and the total stall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct PsiLine {
    /// Percent of the last 10 s stalled.
    pub avg10: f64,
    /// Percent of the last 60 s stalled.
    pub avg60: f64,
    /// Percent of the last 300 s stalled.
    pub avg300: f64,
    /// Total stall time in microseconds.
    pub total: u64,
}

/// A PSI file (`/proc/pressure/memory`, `<cgroup>/memory.pressure`): the `some` line and, where the kernel gives
/// it, the `full` line (`/proc/pressure/cpu` had no `full` line before 5.13).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Psi {
    /// Some task stalled.
    pub some: PsiLine,
    /// All non-idle tasks stalled at once.
    pub full: Option<PsiLine>,
}

/// Parses a PSI file.
pub fn parse_psi(text: &str) -> Result<Psi, String> {
    let mut some = None;
    let mut full = None;
    for (key, fields) in parse_nested_keyed(text)? {
        let get_f = |name: &str| -> Result<f64, String> {
            let v = fields.get(name).ok_or_else(|| format!("{key} line lacks {name}"))?;
            let x = v.parse::<f64>().map_err(|e| format!("{key} {name}={:?}: {e}", shorten(v)))?;
            if x.is_finite() && x >= 0.0 { Ok(x) } else { Err(format!("{key} {name}={x} is out of range")) }
        };
        let total = fields.get("total").ok_or_else(|| format!("{key} line lacks total"))?;
        let line = PsiLine {
            avg10: get_f("avg10")?,
            avg60: get_f("avg60")?,
            avg300: get_f("avg300")?,
            total: parse_u64(total).map_err(|e| format!("{key} total: {e}"))?,
        };
        match key.as_str() {
            "some" => some = Some(line),
            "full" => full = Some(line),
            other => return Err(format!("unknown PSI line {:?}", shorten(other))),
        }
    }
    let some = some.ok_or_else(|| "no \"some\" line".to_owned())?;
    Ok(Psi { some, full })
}

/// The `/proc/meminfo` fields nodewarden uses, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Meminfo {
    /// `MemTotal`.
    pub mem_total: u64,
    /// `MemFree`.
    pub mem_free: u64,
    /// `MemAvailable` (Linux 3.14 and newer).
    pub mem_available: Option<u64>,
    /// `Inactive(file)`.
    pub inactive_file: Option<u64>,
}

/// Parses `/proc/meminfo` (`Key:   value kB` lines). `MemTotal` and `MemFree` are required; lines nodewarden does
/// not use are ignored, whatever their form.
pub fn parse_meminfo(text: &str) -> Result<Meminfo, String> {
    let mut m = Meminfo::default();
    let (mut total, mut free) = (None, None);
    for (n, line) in text.lines().enumerate() {
        let Some((key, rest)) = line.split_once(':') else { continue };
        let slot = match key.trim() {
            "MemTotal" => &mut total,
            "MemFree" => &mut free,
            "MemAvailable" => &mut m.mem_available,
            "Inactive(file)" => &mut m.inactive_file,
            _ => continue,
        };
        let mut it = rest.split_whitespace();
        let value = it.next().ok_or_else(|| format!("line {}: {key} has no value", n + 1))?;
        let value = parse_u64(value).map_err(|e| format!("line {}: {key}: {e}", n + 1))?;
        let bytes = match it.next() {
            None => value,
            Some("kB") => value.checked_mul(1024).ok_or_else(|| format!("line {}: {key} overflows", n + 1))?,
            Some(unit) => return Err(format!("line {}: {key} has unknown unit {:?}", n + 1, shorten(unit))),
        };
        *slot = Some(bytes);
    }
    m.mem_total = total.ok_or_else(|| "no MemTotal line".to_owned())?;
    m.mem_free = free.ok_or_else(|| "no MemFree line".to_owned())?;
    Ok(m)
}

/// Parses a CPU list such as `/sys/devices/system/cpu/online` or `cpuset.cpus.effective` (`0-3,8,10-11`) and
/// returns the number of CPUs in it.
pub fn parse_cpu_list_count(text: &str) -> Result<u64, String> {
    // No kernel numbers CPUs this high (`CONFIG_NR_CPUS` is at most 8192): a larger ID is not a CPU list.
    const MAX_CPU_ID: u64 = 1 << 20;
    let cpu_id = |s: &str| {
        let id = parse_u64(s)?;
        if id > MAX_CPU_ID {
            return Err(format!("CPU {id} is beyond any kernel's CPU count"));
        }
        Ok(id)
    };
    let t = text.trim();
    if t.is_empty() {
        return Ok(0);
    }
    let mut count: u64 = 0;
    for part in t.split(',') {
        let n = match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (cpu_id(a)?, cpu_id(b)?);
                if b < a {
                    return Err(format!("descending CPU range {part:?}"));
                }
                b - a + 1
            }
            None => {
                cpu_id(part)?;
                1
            }
        };
        count = count.checked_add(n).ok_or_else(|| "CPU count overflows".to_owned())?;
    }
    Ok(count)
}

/// Parses `/proc/loadavg` and returns the number of scheduling entities (threads) that exist, the number after
/// the `/` in the fourth field.
pub fn parse_loadavg_threads(text: &str) -> Result<u64, String> {
    let field = text.split_whitespace().nth(3).ok_or_else(|| "fewer than 4 fields".to_owned())?;
    let (_, total) =
        field.split_once('/').ok_or_else(|| format!("expected RUNNING/TOTAL, found {:?}", shorten(field)))?;
    parse_u64(total)
}

fn shorten(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MEMORY_STAT: &str = "anon 1052672\nfile 4096\nkernel 180224\ninactive_file 4096\nactive_file 0\n";
    const PSI: &str =
        "some avg10=0.12 avg60=1.50 avg300=0.00 total=12345\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=99\n";

    #[test]
    fn limits() {
        assert_eq!(parse_limit("max\n"), Ok(Limit::Max));
        assert_eq!(parse_limit("1048576\n"), Ok(Limit::Value(1_048_576)));
        assert!(parse_limit("-1").is_err());
        assert!(parse_limit("").is_err());
    }

    #[test]
    fn cpu_max() {
        assert_eq!(parse_cpu_max("max 100000\n"), Ok(CpuMax { quota: None, period: 100_000 }));
        assert_eq!(parse_cpu_max("50000 100000"), Ok(CpuMax { quota: Some(50_000), period: 100_000 }));
        assert!(parse_cpu_max("50000").is_err());
        assert!(parse_cpu_max("1 2 3").is_err());
        assert_eq!(CpuMax { quota: None, period: 100_000 }.to_string(), "max 100000");
    }

    #[test]
    fn flat_keyed() {
        let m = parse_flat_keyed(MEMORY_STAT).expect("valid memory.stat");
        assert_eq!(m.get("inactive_file"), Some(&4096));
        assert_eq!(m.len(), 5);
        assert!(parse_flat_keyed("anon\n").unwrap_err().contains("line 1"));
        assert!(parse_flat_keyed("anon 1\nfile x\n").unwrap_err().contains("line 2"));
    }

    #[test]
    fn psi() {
        let p = parse_psi(PSI).expect("valid PSI");
        assert_eq!(p.some.avg60, 1.5);
        assert_eq!(p.some.total, 12345);
        assert_eq!(p.full.map(|f| f.total), Some(99));
        let cpu_old = parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").expect("some only");
        assert_eq!(cpu_old.full, None);
        for bad in ["", "some avg10=1", "some avg10=x avg60=0 avg300=0 total=0", "some avg10=0", "most avg10=0"] {
            assert!(parse_psi(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_psi("some avg10=NaN avg60=0 avg300=0 total=0").is_err());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list_count("0-3,8,10-11\n"), Ok(7));
        assert_eq!(parse_cpu_list_count("0\n"), Ok(1));
        assert_eq!(parse_cpu_list_count("\n"), Ok(0));
        assert!(parse_cpu_list_count("3-1").is_err());
        assert!(parse_cpu_list_count("a").is_err());
        // A range whose count overflows u64 is refused, not a panic or a wrapped count.
        assert!(parse_cpu_list_count("0-18446744073709551615").is_err());
        assert!(parse_cpu_list_count("18446744073709551615").is_err());
        assert_eq!(parse_cpu_list_count("0-1048575"), Ok(1 << 20));
    }

    #[test]
    fn meminfo() {
        let m = parse_meminfo(
            "MemTotal:  1000 kB\nMemFree: 10 kB\nMemAvailable: 500 kB\nHugePages_Total: 0\nInactive(file): 7 kB\n",
        )
        .expect("valid meminfo");
        assert_eq!(
            m,
            Meminfo { mem_total: 1_024_000, mem_free: 10_240, mem_available: Some(512_000), inactive_file: Some(7168) }
        );
        assert!(parse_meminfo("MemFree: 1 kB\n").unwrap_err().contains("MemTotal"));
        assert!(parse_meminfo("MemTotal: x kB\nMemFree: 1 kB\n").unwrap_err().contains("line 1"));
        assert!(parse_meminfo("MemTotal: 1 MB\nMemFree: 1 kB\n").unwrap_err().contains("unit"));
        assert!(parse_meminfo("MemTotal: 18446744073709551615 kB\nMemFree: 1 kB\n").unwrap_err().contains("overflows"));
    }

    #[test]
    fn loadavg() {
        assert_eq!(parse_loadavg_threads("0.00 0.01 0.05 1/123 4567\n"), Ok(123));
        assert!(parse_loadavg_threads("0.00 0.01").is_err());
        assert!(parse_loadavg_threads("0 0 0 12 3").is_err());
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC*") {
            let _ = parse_limit(&s);
            let _ = parse_cpu_max(&s);
            let _ = parse_flat_keyed(&s);
            let _ = parse_nested_keyed(&s);
            let _ = parse_psi(&s);
            let _ = parse_cpu_list_count(&s);
            let _ = parse_loadavg_threads(&s);
            let _ = parse_meminfo(&s);
        }

        #[test]
        fn psi_like_lines_never_panic(a in "(some|full|x)", b in "[a-z0-9=. ]{0,40}") {
            let _ = parse_psi(&format!("{a} {b}\n"));
        }

        #[test]
        fn flat_keyed_round_trips(entries in proptest::collection::btree_map("[a-z_]{1,12}", any::<u64>(), 0..20)) {
            let text: String = entries.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
            prop_assert_eq!(parse_flat_keyed(&text).expect("generated file"), entries);
        }
    }
}
