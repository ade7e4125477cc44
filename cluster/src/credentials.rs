//! Credentials taken up when their files change, without a restart: the kubeconfig and every file it names
//! (client certificate and key, CA bundle, token file) are looked at every [`POLL`]; when any changed, new clients
//! are built from them and take every request from then on (the kubelet's `rotateCertificates` reloads its client
//! certificate the same way, so a renewed certificate is used before the old one expires). A change that does not
//! make a client (a certificate written before its key) keeps the clients in force until the next change.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::Kubeconfig;
use tokio_util::sync::CancellationToken;

use crate::Clients;

/// How often the files are looked at.
pub const POLL: Duration = Duration::from_secs(5);

/// The files the kubeconfig at `path` names for credentials, made absolute from its directory.
fn named_files(path: &Path) -> Vec<PathBuf> {
    let Ok(config) = Kubeconfig::read_from(path) else { return Vec::new() };
    let base = path.parent().unwrap_or(Path::new("/"));
    let users = config.auth_infos.into_iter().filter_map(|a| a.auth_info);
    let user_files = users.flat_map(|u| [u.client_certificate, u.client_key, u.token_file]);
    let clusters = config.clusters.into_iter().filter_map(|c| c.cluster).map(|c| c.certificate_authority);
    user_files.chain(clusters).flatten().map(|f| base.join(f)).collect()
}

/// What the credentials are now: the kubeconfig's bytes and those of every file it names (a file that cannot be
/// read counts as empty).
fn fingerprint(path: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    std::iter::once(path.to_path_buf())
        .chain(named_files(path))
        .map(|f| {
            let bytes = std::fs::read(&f).unwrap_or_default();
            (f, bytes)
        })
        .collect()
}

async fn read(path: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || fingerprint(&path)).await.unwrap_or_default()
}

/// Watches the credentials of the kubeconfig at `path` until `shutdown`, giving `clients` new ones when they
/// change (built as [`Clients::from_config`] builds them, with the same rate limit).
pub async fn watch(
    path: PathBuf,
    clients: Clients,
    qps: f64,
    burst: u32,
    timeout: Duration,
    shutdown: CancellationToken,
) {
    let mut seen = read(&path).await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
        let now = read(&path).await;
        if now == seen {
            continue;
        }
        seen = now;
        let built = match Clients::read_kubeconfig(&path).await {
            Ok(config) => tokio::task::spawn_blocking(move || Clients::from_config(config, qps, burst, timeout))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string())),
            Err(e) => Err(e.to_string()),
        };
        match built {
            Ok(new) => {
                clients.replace(&new);
                tracing::info!(kubeconfig = %path.display(), "the credentials changed; new requests use them");
            }
            Err(e) => tracing::warn!(
                kubeconfig = %path.display(),
                error = %e,
                "the credentials changed but cannot be used; the ones in force are kept"
            ),
        }
    }
}
