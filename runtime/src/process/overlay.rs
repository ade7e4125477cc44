//! Volumes whose `mountPath` does not exist on the node. The process runtime shares the node's file system and
//! creates nothing there for a container, yet every real pod mounts such a path: the service account token goes to
//! `/var/run/secrets/kubernetes.io/serviceaccount`. So, in the container's private mount namespace only, the nearest
//! existing directory above the path is overlaid: an overlayfs whose lower layer is that directory itself and whose
//! upper and work directories belong to the runtime (under its scratch directory), with the node's mounts below the
//! directory attached again on top (an overlay shows only the lower directory's own file system). The missing
//! directories, and the last component (an empty file when the volume is a file), are then made in the overlay:
//! they land in its upper directory, never on the node, and the volume is bind mounted on them as on any path.
//!
//! This module is the plan, a pure function of what the node's file system and mount table say (given to it, so
//! that it is tested with tables); `exec` turns it into the system calls' arguments before the fork and
//! `sys::ChildSetup` makes the calls in the child, where nothing can be checked with a message any more.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

/// What a path is on the node, as far as the plan needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
    /// Nothing is there.
    Missing,
    /// A symbolic link whose target does not exist: a directory cannot be made in its place.
    DanglingLink,
    /// A directory, or a link to one.
    Directory,
    /// Anything else that exists (a file, a device, a link to one).
    Other,
}

impl Probe {
    /// What `path` is on this node, links followed.
    pub(super) fn of(path: &Path) -> Self {
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Self::Directory,
            Ok(_) => Self::Other,
            Err(_) if std::fs::symlink_metadata(path).is_ok() => Self::DanglingLink,
            Err(_) => Self::Missing,
        }
    }
}

/// A volume to mount, as the plan sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Wanted<'a> {
    /// Its `mountPath`.
    pub target: &'a Path,
    /// Its source is a directory (else a file: the missing last component is made as an empty file).
    pub source_is_dir: bool,
}

/// A directory overlaid in the container's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Overlay {
    /// The nearest existing directory above one or more missing mountPaths, resolved (`/var/run` is usually a
    /// link to `/run`): the overlay's lower layer, and where the overlay is placed.
    pub lower: PathBuf,
    /// The top-most mount points strictly below `lower` on the node (those below no other one of the list), each
    /// attached again in the overlay at the same place, with what is mounted below it.
    pub submounts: Vec<PathBuf>,
    /// What is made in the overlay, relative to `lower`, parents first: `true` for a directory, `false` for an
    /// empty file.
    pub create: Vec<(PathBuf, bool)>,
    /// The overlay (an index into [`Plan::overlays`]) of the nearest overlaid directory above `lower`: this one is
    /// placed inside that one, which is why the plan lists an overlay before the one it goes into.
    pub parent: Option<usize>,
}

/// How a container's volumes are mounted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Plan {
    /// The overlays, deepest `lower` first; none when every mountPath exists.
    pub overlays: Vec<Overlay>,
    /// For each volume, in order, where it is bind mounted: its mountPath when that exists (as before), else the
    /// path made for it in its overlay (the resolved directory and the missing components).
    pub targets: Vec<PathBuf>,
}

/// The characters an overlayfs option string cannot carry in a path: `,` separates options, `:` lower layers,
/// `\` escapes; a NUL ends the string.
const NOT_IN_OPTIONS: [char; 4] = [',', ':', '\\', '\0'];

/// Refuses a path that cannot go into an overlayfs option string; `what` names it in the message.
pub(super) fn check_option_path(what: &str, path: &Path) -> Result<(), String> {
    let text = path.as_os_str().as_bytes();
    if NOT_IN_OPTIONS.iter().any(|c| u8::try_from(*c).is_ok_and(|b| text.contains(&b))) {
        return Err(format!(
            "{what} {} contains ',', ':', '\\' or a NUL byte, so it cannot be given to overlayfs",
            path.display()
        ));
    }
    Ok(())
}

/// The plan for `wanted`: `probe` says what a path is on the node, `resolve` resolves a directory's links (as
/// `std::fs::canonicalize`), `mountinfo` is the daemon's `/proc/thread-self/mountinfo`. A mountPath that is
/// missing must be absolute, free of `..`, below an existing directory that resolves to a path overlayfs can take,
/// and must not need a path made both as a file and as a directory; the errors name the path.
pub(super) fn plan(
    wanted: &[Wanted<'_>],
    probe: impl Fn(&Path) -> Probe,
    resolve: impl Fn(&Path) -> Result<PathBuf, String>,
    mountinfo: &str,
) -> Result<Plan, String> {
    let mut overlays: Vec<Overlay> = Vec::new();
    let mut targets = Vec::with_capacity(wanted.len());
    for w in wanted {
        if matches!(probe(w.target), Probe::Directory | Probe::Other) {
            targets.push(w.target.to_path_buf());
            continue;
        }
        let (lower, missing) = missing_below(w.target, &probe, &resolve)?;
        check_option_path(
            &format!("mountPath {} is missing, and its nearest existing directory", w.target.display()),
            &lower,
        )?;
        let at = match overlays.iter().position(|o| o.lower == lower) {
            Some(i) => i,
            None => {
                overlays.push(Overlay {
                    lower: lower.clone(),
                    submounts: Vec::new(),
                    create: Vec::new(),
                    parent: None,
                });
                overlays.len() - 1
            }
        };
        let create = &mut overlays[at].create;
        let mut rel = PathBuf::new();
        for (i, name) in missing.iter().enumerate() {
            rel.push(name);
            let dir = i + 1 < missing.len() || w.source_is_dir;
            match create.iter().find(|(p, _)| *p == rel) {
                Some((_, made_dir)) if *made_dir != dir => {
                    return Err(format!(
                        "mountPath {}: {} would have to be made both as a directory and as a file for two volumes",
                        w.target.display(),
                        lower.join(&rel).display()
                    ));
                }
                Some(_) => {}
                None => create.push((rel.clone(), dir)),
            }
        }
        targets.push(lower.join(&rel));
    }
    let points = mount_points(mountinfo);
    for o in &mut overlays {
        o.submounts = submounts_below(&points, &o.lower);
    }
    // Deepest first, so that an overlay is complete before it is placed in the one above it.
    overlays
        .sort_by(|a, b| b.lower.components().count().cmp(&a.lower.components().count()).then(a.lower.cmp(&b.lower)));
    let parents: Vec<Option<usize>> = overlays
        .iter()
        .map(|o| {
            overlays
                .iter()
                .enumerate()
                .filter(|(_, p)| p.lower != o.lower && o.lower.starts_with(&p.lower))
                .max_by_key(|(_, p)| p.lower.components().count())
                .map(|(j, _)| j)
        })
        .collect();
    for (o, parent) in overlays.iter_mut().zip(parents) {
        o.parent = parent;
    }
    Ok(Plan { overlays, targets })
}

/// The nearest existing directory above a missing `target`, resolved, and the missing components below it, in
/// order.
fn missing_below(
    target: &Path,
    probe: &impl Fn(&Path) -> Probe,
    resolve: &impl Fn(&Path) -> Result<PathBuf, String>,
) -> Result<(PathBuf, Vec<OsString>), String> {
    let shown = target.display();
    if !target.is_absolute() {
        return Err(format!("mountPath {shown} does not exist on this node and is not an absolute path"));
    }
    if target.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "mountPath {shown} does not exist on this node and has a '..' component: a missing mountPath is made in \
             the container's view of the node, which needs a plain path"
        ));
    }
    // Without `.` components or a trailing slash, so that parents and names are the path's own.
    let target: PathBuf = target.components().collect();
    let mut missing = Vec::new();
    let mut at = target.as_path();
    loop {
        match probe(at) {
            Probe::Directory => break,
            Probe::Missing => {}
            Probe::DanglingLink => {
                return Err(format!(
                    "mountPath {shown}: {} is a symbolic link to a path that does not exist",
                    at.display()
                ));
            }
            Probe::Other => {
                return Err(format!("mountPath {shown}: {} exists and is not a directory", at.display()));
            }
        }
        let (Some(parent), Some(name)) = (at.parent(), at.file_name()) else {
            return Err(format!("mountPath {shown}: no directory above it exists"));
        };
        missing.push(name.to_owned());
        at = parent;
    }
    missing.reverse();
    let lower = resolve(at)?;
    if !lower.is_absolute() {
        return Err(format!("mountPath {shown}: {} resolves to a relative path", at.display()));
    }
    Ok((lower, missing))
}

/// The mount points of a `mountinfo` text (the fifth field, with the kernel's octal escapes of space, tab, newline
/// and backslash undone), in its order.
pub(super) fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(OsString::from_vec(unescape(p))))
        .collect()
}

/// A mountinfo field with its `\ooo` escapes undone; a backslash that starts no escape is kept.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let code = bytes.get(i + 1..i + 4).filter(|_| b == b'\\').and_then(|d| {
            d.iter()
                .try_fold(0u32, |n, &c| (b'0'..=b'7').contains(&c).then(|| n * 8 + u32::from(c - b'0')))
                .and_then(|n| u8::try_from(n).ok())
        });
        match code {
            Some(c) => {
                out.push(c);
                i += 4;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// The top-most of `points` strictly below `dir`: those below no other one below `dir`, sorted, without duplicates
/// (a path mounted over twice is listed twice).
pub(super) fn submounts_below(points: &[PathBuf], dir: &Path) -> Vec<PathBuf> {
    let mut below: Vec<&PathBuf> = points.iter().filter(|p| p.starts_with(dir) && p.as_path() != dir).collect();
    // Component-wise order puts every path right after the paths above it.
    below.sort();
    below.dedup();
    let mut top: Vec<PathBuf> = Vec::new();
    for p in below {
        if top.last().is_none_or(|t| !p.starts_with(t)) {
            top.push(p.clone());
        }
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's file system for the plan: directories, other files and dangling links, with links to resolve.
    struct Node {
        dirs: Vec<&'static str>,
        files: Vec<&'static str>,
        dangling: Vec<&'static str>,
        links: Vec<(&'static str, &'static str)>,
    }

    impl Node {
        fn new() -> Self {
            Self {
                dirs: vec!["/", "/var", "/run", "/run/user", "/run/user/0", "/etc", "/data", "/srv,x"],
                files: vec!["/etc/passwd"],
                dangling: vec!["/broken"],
                // `/var/run` is a link to `/run` (a directory, as far as `probe` goes).
                links: vec![("/var/run", "/run")],
            }
        }

        fn probe(&self, p: &Path) -> Probe {
            let p = p.to_str().unwrap();
            if self.dirs.contains(&p) || self.links.iter().any(|(l, _)| *l == p) {
                Probe::Directory
            } else if self.files.contains(&p) {
                Probe::Other
            } else if self.dangling.contains(&p) {
                Probe::DanglingLink
            } else {
                Probe::Missing
            }
        }

        fn resolve(&self, p: &Path) -> Result<PathBuf, String> {
            for (link, to) in &self.links {
                if let Ok(rest) = p.strip_prefix(link) {
                    return Ok(Path::new(to).join(rest));
                }
            }
            Ok(p.to_path_buf())
        }

        fn plan(&self, wanted: &[(&str, bool)], mountinfo: &str) -> Result<Plan, String> {
            let wanted: Vec<Wanted<'_>> =
                wanted.iter().map(|(t, d)| Wanted { target: Path::new(t), source_is_dir: *d }).collect();
            plan(&wanted, |p| self.probe(p), |p| self.resolve(p), mountinfo)
        }
    }

    /// A mountinfo line for a mount at `point`.
    fn line(id: u32, point: &str) -> String {
        format!("{id} 1 0:{id} / {point} rw,relatime shared:1 - tmpfs tmpfs rw\n")
    }

    fn paths(p: &[&str]) -> Vec<PathBuf> {
        p.iter().map(PathBuf::from).collect()
    }

    fn made(c: &[(&str, bool)]) -> Vec<(PathBuf, bool)> {
        c.iter().map(|(p, d)| (PathBuf::from(p), *d)).collect()
    }

    #[test]
    fn existing_mount_paths_need_no_overlay_and_keep_their_paths() {
        let node = Node::new();
        let plan = node.plan(&[("/data", true), ("/etc/passwd", false), ("/var/run", true)], "").unwrap();
        assert_eq!(plan, Plan { overlays: vec![], targets: paths(&["/data", "/etc/passwd", "/var/run"]) });
    }

    #[test]
    fn a_missing_mount_path_overlays_its_nearest_directory_resolved_with_the_mounts_below_it() {
        let node = Node::new();
        let mountinfo = [
            line(1, "/"),
            line(2, "/run"),
            line(3, "/run/user/0"),
            line(4, "/run/user/0/gvfs"),
            line(5, "/run/lock"),
            line(6, "/runner"),
            line(7, "/run/with\\040space"),
            line(8, "/run/lock"),
        ]
        .concat();
        let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
        let plan = node.plan(&[(sa, true), ("/var/run/secrets/other/token", false), ("/data", true)], &mountinfo);
        let plan = plan.unwrap();
        assert_eq!(
            plan.targets,
            paths(&["/run/secrets/kubernetes.io/serviceaccount", "/run/secrets/other/token", "/data"])
        );
        assert_eq!(
            plan.overlays,
            vec![Overlay {
                lower: "/run".into(),
                // Not /run itself, nor /runner; /run/user/0/gvfs comes with /run/user/0; the doubled /run/lock once.
                submounts: paths(&["/run/lock", "/run/user/0", "/run/with space"]),
                create: made(&[
                    ("secrets", true),
                    ("secrets/kubernetes.io", true),
                    ("secrets/kubernetes.io/serviceaccount", true),
                    ("secrets/other", true),
                    ("secrets/other/token", false),
                ]),
                parent: None,
            }]
        );
    }

    #[test]
    fn overlays_nest_deepest_first() {
        let node = Node::new();
        let mountinfo = [line(1, "/"), line(2, "/proc"), line(3, "/run"), line(4, "/run/user/0")].concat();
        let wanted =
            [("/nonexistent/a/b", true), ("/run/user/new", true), ("/run/x/", true), ("/./data/./new/", false)];
        let plan = node.plan(&wanted, &mountinfo).unwrap();
        assert_eq!(plan.targets, paths(&["/nonexistent/a/b", "/run/user/new", "/run/x", "/data/new"]));
        let summary: Vec<(&Path, Option<usize>)> =
            plan.overlays.iter().map(|o| (o.lower.as_path(), o.parent)).collect();
        assert_eq!(
            summary,
            vec![
                (Path::new("/run/user"), Some(2)),
                (Path::new("/data"), Some(3)),
                (Path::new("/run"), Some(3)),
                (Path::new("/"), None),
            ]
        );
        assert_eq!(plan.overlays[0].submounts, paths(&["/run/user/0"]));
        assert_eq!(plan.overlays[3].submounts, paths(&["/proc", "/run"]));
        assert_eq!(
            plan.overlays[3].create,
            made(&[("nonexistent", true), ("nonexistent/a", true), ("nonexistent/a/b", true)])
        );
        assert_eq!(plan.overlays[1].create, made(&[("new", false)]));
    }

    #[test]
    fn paths_that_cannot_be_made_are_refused_by_name() {
        let node = Node::new();
        for (wanted, error) in [
            (
                vec![("relative/path", true)],
                "mountPath relative/path does not exist on this node and is not an absolute",
            ),
            (vec![("/data/../new", true)], "mountPath /data/../new does not exist on this node and has a '..'"),
            (vec![("/etc/passwd/x", true)], "mountPath /etc/passwd/x: /etc/passwd exists and is not a directory"),
            (
                vec![("/broken/x", true)],
                "mountPath /broken/x: /broken is a symbolic link to a path that does not exist",
            ),
            (vec![("/broken", true)], "mountPath /broken: /broken is a symbolic link"),
            (
                vec![("/srv,x/new", true)],
                "mountPath /srv,x/new is missing, and its nearest existing directory /srv,x contains ','",
            ),
            (
                vec![("/new/a", false), ("/new/a/b", true)],
                "mountPath /new/a/b: /new/a would have to be made both as a directory and as a file",
            ),
        ] {
            let got = node.plan(&wanted, "").unwrap_err();
            assert!(got.starts_with(error), "{wanted:?}: {got}");
        }
        // The same missing path twice is made once.
        let plan = node.plan(&[("/new/a", true), ("/new/a", true)], "").unwrap();
        assert_eq!(plan.overlays[0].create, made(&[("new", true), ("new/a", true)]));
        // A path with a comma below the overlaid directory never goes into the option string.
        assert!(node.plan(&[("/data/a,b", true)], "").is_ok());
    }

    #[test]
    fn the_option_string_check_names_the_path() {
        assert!(check_option_path("x", Path::new("/a/b")).is_ok());
        for bad in ["/a,b", "/a:b", "/a\\b", "/a\0b"] {
            assert!(check_option_path("the directory", Path::new(bad)).unwrap_err().starts_with("the directory /a"));
        }
    }

    #[test]
    fn mount_points_are_read_with_their_escapes_undone() {
        let text = "22 27 0:21 / /proc rw - proc proc rw\n\
                    28 27 0:25 / /mnt/a\\040b\\011c\\134d\\012 ro - tmpfs x ro\n\
                    29 27 0:26 / /mnt/odd\\9 ro - tmpfs x ro\n\
                    short line\n";
        assert_eq!(mount_points(text), paths(&["/proc", "/mnt/a b\tc\\d\n", "/mnt/odd\\9"]));
        assert_eq!(unescape("\\777"), b"\\777", "not a byte: kept as it is");
        assert_eq!(unescape("end\\04"), b"end\\04");
    }

    #[test]
    fn submounts_are_the_top_most_ones_strictly_below() {
        let points = paths(&["/", "/run", "/run/a", "/run/a/b", "/run/ab", "/run/b/c", "/runx", "/run/a"]);
        assert_eq!(submounts_below(&points, Path::new("/run")), paths(&["/run/a", "/run/ab", "/run/b/c"]));
        assert_eq!(submounts_below(&points, Path::new("/")), paths(&["/run", "/runx"]));
        assert!(submounts_below(&points, Path::new("/run/a/b")).is_empty());
    }
}
