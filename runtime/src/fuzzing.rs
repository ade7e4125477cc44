//! The entry point of the `cri_responses` fuzz target of `fuzz/`: arbitrary bytes read the way the CRI client reads
//! a runtime's answers. The code under it must never panic, whatever the input.

use nodewarden_proto::v1::{ContainerStatusResponse, ListImagesResponse, PodSandboxStatusResponse, StatusResponse};
use prost::Message;

use crate::cri::responses;

/// A CRI runtime's answer: the first byte says which (a container's status, a sandbox's status, the runtime's
/// `Status`, its image list), the rest is the protobuf message. What nodewarden reads from it: an exited
/// container's exit (its signal only from a code above 128), the sandbox's non-empty addresses, whether the
/// runtime and its network are ready, the images' names.
pub fn cri_response(bytes: &[u8]) {
    let Some((kind, message)) = bytes.split_first() else { return };
    match kind % 4 {
        0 => {
            let Ok(r) = ContainerStatusResponse::decode(message) else { return };
            if let Some(exit) = r.status.and_then(responses::exit_of) {
                assert_eq!(exit.signal.is_some(), exit.exit_code > 128, "{exit:?}");
            }
        }
        1 => {
            let Ok(r) = PodSandboxStatusResponse::decode(message) else { return };
            assert!(responses::sandbox_ips(r).iter().all(|ip| !ip.is_empty()));
        }
        2 => {
            let Ok(r) = StatusResponse::decode(message) else { return };
            let (runtime, network) = responses::problems(&r);
            let ready = |kind: &str| {
                r.status
                    .as_ref()
                    .is_some_and(|s| s.conditions.iter().find(|c| c.r#type == kind).is_some_and(|c| c.status))
            };
            assert_eq!(runtime.is_none(), ready("RuntimeReady"));
            assert_eq!(network.is_none(), ready("NetworkReady"));
        }
        _ => {
            let Ok(r) = ListImagesResponse::decode(message) else { return };
            for i in r.images {
                let names = i.repo_digests.len() + i.repo_tags.len();
                assert_eq!(responses::image_summary(i).names.len(), names);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_point_takes_good_and_bad_input() {
        for kind in 0..4u8 {
            cri_response(&[kind]);
            cri_response(&[kind, 0x0a, 0x02, 0x08, 0x01]);
        }
    }
}
