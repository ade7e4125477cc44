//! `nodewarden cri`: a debugging CLI in the spirit of crictl, on the daemon's own CRI client, against any CRI
//! endpoint: `ps`, `pods`, `images`, `inspect ID`, `logs ID`, `exec ID -- CMD`. IDs may be abbreviated to a
//! unique prefix.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use nodewarden_proto::v1::ContainerState;
use nodewarden_runtime::cri::{CriClient, POD_NAME_LABEL};
use serde_json::{Value, json};

/// The endpoint when neither `--endpoint` nor `CONTAINER_RUNTIME_ENDPOINT` says.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// A `nodewarden cri` command.
#[derive(Debug, Subcommand)]
pub enum CriCommand {
    /// List containers (running ones unless --all).
    Ps {
        /// Include containers that are not running.
        #[arg(long, short)]
        all: bool,
    },
    /// List pod sandboxes.
    Pods,
    /// List images.
    Images,
    /// Show a container's or sandbox's status as JSON, with the runtime's extra information.
    Inspect {
        /// The container or sandbox ID (or a unique prefix).
        id: String,
    },
    /// Print a container's log (the message of each CRI log line).
    Logs {
        /// The container ID (or a unique prefix).
        id: String,
        /// Only the last N lines.
        #[arg(long)]
        tail: Option<usize>,
    },
    /// Run a command in a container and exit with its exit code.
    Exec {
        /// The container ID (or a unique prefix).
        id: String,
        /// Seconds before the runtime kills the command (0: never).
        #[arg(long, default_value_t = 0)]
        timeout: u64,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
}

fn ago(nanos: i64) -> String {
    let now = jiff::Timestamp::now().as_nanosecond();
    let secs = u64::try_from((now - i128::from(nanos)) / 1_000_000_000).unwrap_or(0);
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86_400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86_400),
    }
}

fn short(id: &str) -> &str {
    id.get(..13).unwrap_or(id)
}

fn table(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|i| rows.iter().map(|r| r.get(i).map_or(0, String::len)).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", line.join("   ").trim_end());
    }
    out
}

/// `RUNNING`, `EXITED`, `READY`, `NOTREADY`: the protobuf name without its `CONTAINER_`/`SANDBOX_` prefix.
fn state_name(proto_name: &str) -> &str {
    proto_name.trim_start_matches("CONTAINER_").trim_start_matches("SANDBOX_")
}

/// The one ID among `ids` that `prefix` names.
fn resolve<'a>(prefix: &str, ids: impl Iterator<Item = &'a str>, what: &str) -> anyhow::Result<Option<String>> {
    let found: Vec<&str> = ids.filter(|id| id.starts_with(prefix)).collect();
    match found.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some((*one).to_owned())),
        _ => bail!("{prefix:?} names {} {what}s; give more of the ID", found.len()),
    }
}

async fn container_id(client: &CriClient, prefix: &str) -> anyhow::Result<String> {
    let all = client.list_containers(None).await?;
    resolve(prefix, all.iter().map(|c| c.id.as_str()), "container")?
        .with_context(|| format!("no container {prefix:?} at {}", client.endpoint()))
}

/// The message of each line of a CRI log (`<time> <stream> <P|F> <message>`): partial lines (`P`) are joined with
/// the next. Lines that are not in CRI format are kept as they are.
pub fn cri_log_messages(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut partial = String::new();
    for line in text.lines() {
        let mut parts = line.splitn(4, ' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(_), Some("stdout" | "stderr"), Some(tag @ ("P" | "F")), msg) => {
                partial.push_str(msg.unwrap_or_default());
                if tag == "F" {
                    out.push(std::mem::take(&mut partial));
                }
            }
            _ => out.push(line.to_owned()),
        }
    }
    if !partial.is_empty() {
        out.push(partial);
    }
    out
}

/// The last `n` messages of a CRI log file, read from its end: a window that doubles until it holds more than `n`
/// messages or the whole file, so that `--tail` of a large log reads about what it prints. (The first message of a
/// window may have begun before it, so it is only taken from the start of the file.)
fn tail_messages(path: &std::path::Path, n: usize) -> std::io::Result<Vec<String>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let mut window: u64 = 64 * 1024;
    loop {
        let start = len.saturating_sub(window);
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        (&mut file).take(len - start).read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes);
        let whole = if start == 0 { &text[..] } else { text.split_once('\n').map_or("", |(_, rest)| rest) };
        let mut messages = cri_log_messages(whole);
        if start == 0 || messages.len() > n {
            let skip = messages.len().saturating_sub(n);
            return Ok(messages.split_off(skip));
        }
        window = window.saturating_mul(2);
    }
}

fn info_json(info: &std::collections::HashMap<String, String>) -> Value {
    info.iter().map(|(k, v)| (k.clone(), serde_json::from_str(v).unwrap_or_else(|_| json!(v)))).collect()
}

/// Runs one command; the exit code is the command's (for `exec`) or 0.
pub async fn run(endpoint: &str, timeout: Duration, command: CriCommand) -> anyhow::Result<i32> {
    let client = CriClient::new(endpoint, timeout)?;
    let mut out = String::new();
    match command {
        CriCommand::Ps { all } => {
            let mut rows = vec![
                ["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD"]
                    .map(String::from)
                    .to_vec(),
            ];
            let containers = client.list_containers(None).await?;
            let pods = client.list_pod_sandbox(None).await?;
            for c in containers.iter().filter(|c| all || c.state() == ContainerState::ContainerRunning) {
                let meta = c.metadata.clone().unwrap_or_default();
                let pod = pods.iter().find(|p| p.id == c.pod_sandbox_id);
                rows.push(vec![
                    short(&c.id).to_owned(),
                    c.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
                    ago(c.created_at),
                    state_name(c.state().as_str_name()).to_owned(),
                    meta.name,
                    meta.attempt.to_string(),
                    short(&c.pod_sandbox_id).to_owned(),
                    pod.and_then(|p| p.labels.get(POD_NAME_LABEL).cloned()).unwrap_or_default(),
                ]);
            }
            out = table(&rows);
        }
        CriCommand::Pods => {
            let mut rows =
                vec![["POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT"].map(String::from).to_vec()];
            for p in client.list_pod_sandbox(None).await? {
                let meta = p.metadata.clone().unwrap_or_default();
                rows.push(vec![
                    short(&p.id).to_owned(),
                    ago(p.created_at),
                    state_name(p.state().as_str_name()).to_owned(),
                    meta.name,
                    meta.namespace,
                    meta.attempt.to_string(),
                ]);
            }
            out = table(&rows);
        }
        CriCommand::Images => {
            let mut rows = vec![["IMAGE", "TAG", "IMAGE ID", "SIZE"].map(String::from).to_vec()];
            for i in client.list_images().await? {
                let id = i.id.trim_start_matches("sha256:");
                let size = format!("{:.1}MB", i.size as f64 / 1e6);
                if i.repo_tags.is_empty() {
                    rows.push(vec!["<none>".into(), "<none>".into(), short(id).to_owned(), size.clone()]);
                }
                for tag in &i.repo_tags {
                    let (repo, t) = tag.rsplit_once(':').unwrap_or((tag, "<none>"));
                    rows.push(vec![repo.to_owned(), t.to_owned(), short(id).to_owned(), size.clone()]);
                }
            }
            out = table(&rows);
        }
        CriCommand::Inspect { id } => {
            let containers = client.list_containers(None).await?;
            let sandboxes = client.list_pod_sandbox(None).await?;
            let value = if let Some(cid) = resolve(&id, containers.iter().map(|c| c.id.as_str()), "container")? {
                let r = client.container_status(&cid, true).await?;
                let s = r.status.unwrap_or_default();
                let meta = s.metadata.clone().unwrap_or_default();
                json!({
                    "status": {
                        "id": s.id, "name": meta.name, "attempt": meta.attempt,
                        "state": state_name(s.state().as_str_name()).to_owned(),
                        "createdAt": s.created_at, "startedAt": s.started_at, "finishedAt": s.finished_at,
                        "exitCode": s.exit_code, "reason": s.reason, "message": s.message,
                        "image": s.image.map(|i| i.image), "imageRef": s.image_ref, "logPath": s.log_path,
                        "labels": s.labels, "annotations": s.annotations,
                        "mounts": s.mounts.iter().map(|m| json!({"containerPath": m.container_path, "hostPath": m.host_path, "readonly": m.readonly})).collect::<Vec<_>>(),
                    },
                    "info": info_json(&r.info),
                })
            } else if let Some(sid) = resolve(&id, sandboxes.iter().map(|s| s.id.as_str()), "sandbox")? {
                let r = client.pod_sandbox_status(&sid).await?;
                let s = r.status.unwrap_or_default();
                let meta = s.metadata.clone().unwrap_or_default();
                json!({
                    "status": {
                        "id": s.id, "name": meta.name, "namespace": meta.namespace, "uid": meta.uid,
                        "attempt": meta.attempt, "state": state_name(s.state().as_str_name()).to_owned(),
                        "createdAt": s.created_at, "ip": s.network.map(|n| n.ip),
                        "labels": s.labels, "annotations": s.annotations,
                    },
                    "info": info_json(&r.info),
                })
            } else {
                bail!("no container or sandbox {id:?} at {endpoint}");
            };
            out = serde_json::to_string_pretty(&value)? + "\n";
        }
        CriCommand::Logs { id, tail } => {
            let cid = container_id(&client, &id).await?;
            let status = client.container_status(&cid, false).await?.status.unwrap_or_default();
            if status.log_path.is_empty() {
                bail!("container {cid} has no log file");
            }
            let lines = tail_messages(std::path::Path::new(&status.log_path), tail.unwrap_or(usize::MAX))
                .with_context(|| format!("cannot read the log {}", status.log_path))?;
            for l in &lines {
                let _ = writeln!(out, "{l}");
            }
        }
        CriCommand::Exec { id, timeout, cmd } => {
            let cid = container_id(&client, &id).await?;
            let r = client.exec_sync(&cid, &cmd, Duration::from_secs(timeout)).await?;
            print!("{}", String::from_utf8_lossy(&r.stdout));
            eprint!("{}", String::from_utf8_lossy(&r.stderr));
            return Ok(r.exit_code);
        }
    }
    print!("{out}");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_of_a_large_log_is_read_from_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let mut text = String::new();
        for i in 0..20_000 {
            text.push_str(&format!("2026-11-30T13:00:00.1Z stdout F line {i}\n"));
        }
        // The last message in three partial lines.
        text.push_str(
            "2026-11-30T13:00:00.1Z stdout P a\n2026-11-30T13:00:00.1Z stdout P b\n2026-11-30T13:00:00.1Z stderr F c\n",
        );
        std::fs::write(&log, &text).unwrap();
        assert_eq!(tail_messages(&log, 3).unwrap(), ["line 19998", "line 19999", "abc"]);
        let all = tail_messages(&log, usize::MAX).unwrap();
        assert_eq!((all.len(), all[0].as_str()), (20_001, "line 0"));
        // More than one window's worth.
        let many = tail_messages(&log, 5_000).unwrap();
        assert_eq!((many.len(), many[0].as_str()), (5_000, "line 15001"));
        assert!(tail_messages(&dir.path().join("missing"), 1).is_err());
    }

    #[test]
    fn cri_log_lines_are_reassembled() {
        let text = "2026-11-30T13:00:00.1Z stdout F hello\n\
                    2026-11-30T13:00:00.2Z stderr P par\n\
                    2026-11-30T13:00:00.3Z stderr F tial\n\
                    2026-11-30T13:00:00.4Z stdout F \n\
                    not a cri line\n";
        assert_eq!(cri_log_messages(text), ["hello", "partial", "", "not a cri line"]);
    }

    #[test]
    fn states_are_shown_as_crictl_shows_them() {
        assert_eq!(state_name(ContainerState::ContainerRunning.as_str_name()), "RUNNING");
        assert_eq!(state_name(ContainerState::ContainerExited.as_str_name()), "EXITED");
        let notready = nodewarden_proto::v1::PodSandboxState::SandboxNotready;
        assert_eq!(state_name(notready.as_str_name()), "NOTREADY");
    }

    #[test]
    fn prefixes_resolve_to_one_id() {
        let ids = ["abc1", "abd2", "xyz"];
        assert_eq!(resolve("x", ids.into_iter(), "container").unwrap().as_deref(), Some("xyz"));
        assert_eq!(resolve("q", ids.into_iter(), "container").unwrap(), None);
        let err = resolve("ab", ids.into_iter(), "container").unwrap_err().to_string();
        assert!(err.contains("2 containers"), "{err}");
    }
}
