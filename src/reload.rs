//! Hot reload of the config file. inotify watches the file's directory (an editor that writes a new file and
//! renames it over the old one, and Kubernetes' `..data` symlink swap, both show up there) and the file itself
//! (through a symlink, its target). Each burst of events is followed by a read ([`SETTLE`] after the burst began,
//! or as soon as a file is renamed over the config); a file whose bytes differ from the last read is reloaded. A
//! file written in place is read only once its writer closed it: a valid prefix of a file being written never
//! applies (unless the writer holds it open, idle, for [`WRITER_IDLE`]). A full check also runs every
//! [`RECHECK`], in case an event was missed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use inotify::{Inotify, WatchMask, Watches};
use nodewarden_eviction::EvictionSettings;
use nodewarden_resources::Ledger;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{self, Config, MAX_CONFIG_BYTES, Reloaded, Section};
use crate::daemon::{NodeReport, NodeResources, eviction_settings};
use crate::metrics::Metrics;

/// What a reload changes: the config in force, and each live section's consumer.
pub struct Reloader {
    /// The configuration in force, which the readers of the config follow.
    pub config: watch::Sender<Arc<Config>>,
    /// The resources section's consumer.
    pub ledger: Ledger,
    /// What the Node reports of the resources section.
    pub node: NodeReport,
    /// The allocatable gauges, and the reloads counted.
    pub metrics: Arc<Metrics>,
    /// The eviction section's consumer.
    pub eviction: watch::Sender<Arc<EvictionSettings>>,
}

impl Reloader {
    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.borrow().clone()
    }

    /// Applies an edited config file: the reloadable fields take effect at once, each changed section handed to
    /// its consumer and an unchanged one to none (the resources section to the ledger first, so a refused cgroup
    /// write leaves everything as it was; the eviction section to the eviction loop); the others are reported as
    /// needing a restart.
    pub async fn apply(&self, text: &str) -> Result<Vec<&'static str>, String> {
        let running = self.config();
        let Reloaded { config, changed, needs_restart } = config::reload(&running, text).map_err(|e| e.to_string())?;
        if config == *running {
            return Ok(needs_restart);
        }
        if changed.contains(&Section::Resources) {
            let resources = config.resources.clone();
            let applied = self
                .ledger
                .call(move |m| m.reconfigure(resources).map(|()| (*m.allocatable(), NodeResources::of(m))))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            let (alloc, node) = applied.map_err(|e| format!("cannot apply the new resources: {e}"))?;
            self.node.set(node);
            self.metrics.set_allocatable(&alloc, config.resources.max_pods);
        }
        if changed.contains(&Section::Eviction) {
            self.eviction.send_replace(Arc::new(eviction_settings(&config)));
        }
        self.config.send_replace(Arc::new(config));
        Ok(needs_restart)
    }
}

/// Events closer together than this are one edit.
const SETTLE: Duration = Duration::from_millis(50);
/// A full check, whatever the events, this often.
const RECHECK: Duration = Duration::from_secs(10);
/// A file written in place whose writer has neither written nor closed it for this long is read as it is.
const WRITER_IDLE: Duration = Duration::from_secs(30);

fn watch_paths(mut watches: Watches, path: &Path) {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    // MODIFY too: a file made anew (removed, then written) has no watch of its own until the burst is over.
    let dir_mask = WatchMask::CLOSE_WRITE
        | WatchMask::MODIFY
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::ATTRIB;
    if let Err(e) = watches.add(dir, dir_mask) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the config directory; checking every 10s");
    }
    let file_mask = WatchMask::CLOSE_WRITE | WatchMask::MODIFY | WatchMask::DELETE_SELF | WatchMask::MOVE_SELF;
    // The file may be missing for a moment during a replace; the directory watch covers that.
    let _ = watches.add(path, file_mask);
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    nodewarden_resources::read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| e.to_string())
}

/// Watches `path` until drained, applying each changed version to the daemon.
pub async fn watch(path: PathBuf, reloader: Arc<Reloader>, shutdown: CancellationToken) {
    let mut last = read(&path).ok();
    let inotify = match Inotify::init() {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(error = %e, "cannot use inotify; the config file is checked every 10s");
            return recheck_only(path, reloader, shutdown, last).await;
        }
    };
    watch_paths(inotify.watches(), &path);
    let mut events = match inotify.into_event_stream(vec![0u8; 4096]) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read inotify events; the config file is checked every 10s");
            return recheck_only(path, reloader, shutdown, last).await;
        }
    };
    let mut tick = tokio::time::interval(RECHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let name = path.file_name().map(std::ffi::OsStr::to_os_string);
    // Since when the file has been open for writing in place (written, not closed yet).
    let mut writing: Option<tokio::time::Instant> = None;
    loop {
        // Events first: a recheck must not read a file whose writes are queued unread.
        let event = tokio::select! {
            biased;
            ev = events.next() => match ev {
                Some(ev) => Some(ev),
                None => {
                    tracing::warn!("the config watch ended; the config file is checked every 10s");
                    break;
                }
            },
            _ = tick.tick() => None,
            () = shutdown.cancelled() => return,
        };
        if let Some(first) = event {
            // Let the rest of the edit arrive, for SETTLE, or until a whole file is renamed into place over the
            // config (a writer's close does not end the wait: a script may write the file in several opens),
            // then take everything that queued up.
            let mut whole = renamed_over(&first, name.as_deref());
            let mut seen = vec![first];
            let settled = tokio::time::Instant::now() + SETTLE;
            while !whole {
                match tokio::time::timeout_at(settled, events.next()).await {
                    Ok(Some(ev)) => {
                        whole = renamed_over(&ev, name.as_deref());
                        seen.push(ev);
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            while let Ok(Some(ev)) = tokio::time::timeout(Duration::ZERO, events.next()).await {
                seen.push(ev);
            }
            for ev in seen.into_iter().filter_map(Result::ok) {
                // Events of the file's own watch have no name; the directory's name the entry.
                if ev.name.is_some() && ev.name != name {
                    continue;
                }
                if ev.mask.contains(inotify::EventMask::MODIFY) {
                    writing = Some(tokio::time::Instant::now());
                }
                if ev.mask.intersects(inotify::EventMask::CLOSE_WRITE | inotify::EventMask::MOVED_TO) {
                    writing = None;
                }
            }
            // Watch the file again: a replaced file is a new inode.
            watch_paths(events.watches(), &path);
        }
        if let Some(since) = writing {
            if since.elapsed() < WRITER_IDLE {
                continue;
            }
            tracing::warn!(file = %path.display(), "the config file has been open for writing, idle, for 30s; reading it");
            writing = None;
        }
        check(&path, &reloader, &mut last).await;
    }
    recheck_only(path, reloader, shutdown, last).await;
}

/// Whether `ev` is a file renamed over the config (`name`) in its directory (`sed -i`, an editor's save, a write
/// and rename): such a file is whole when it appears.
fn renamed_over(ev: &std::io::Result<inotify::EventOwned>, name: Option<&std::ffi::OsStr>) -> bool {
    ev.as_ref().is_ok_and(|ev| {
        ev.name.is_some() && ev.name.as_deref() == name && ev.mask.contains(inotify::EventMask::MOVED_TO)
    })
}

async fn recheck_only(path: PathBuf, reloader: Arc<Reloader>, shutdown: CancellationToken, mut last: Option<Vec<u8>>) {
    let mut tick = tokio::time::interval(RECHECK);
    loop {
        tokio::select! {
            _ = tick.tick() => check(&path, &reloader, &mut last).await,
            () = shutdown.cancelled() => return,
        }
    }
}

/// Reads the file; when its bytes changed, reloads it.
async fn check(path: &Path, reloader: &Reloader, last: &mut Option<Vec<u8>>) {
    let bytes = match read(path) {
        Ok(b) => b,
        // Mid-replace, or deleted: keep running with what is in force.
        Err(e) => {
            tracing::debug!(file = %path.display(), error = %e, "config file not readable now");
            return;
        }
    };
    if last.as_ref() == Some(&bytes) {
        return;
    }
    *last = Some(bytes.clone());
    let result = match String::from_utf8(bytes) {
        Ok(text) => reloader.apply(&text).await,
        Err(_) => Err("the file is not UTF-8".to_owned()),
    };
    match result {
        Ok(needs_restart) => {
            reloader.metrics.config_reloaded(true);
            tracing::info!(file = %path.display(), "config reloaded");
            for field in needs_restart {
                tracing::warn!(field, "config field changed, but it only takes effect after a restart");
            }
        }
        Err(e) => {
            reloader.metrics.config_reloaded(false);
            tracing::error!(file = %path.display(), error = %e, "config reload refused; the running config stays");
        }
    }
}
