//! The images section: the image garbage collector's thresholds and ages, from `imageGCHighThresholdPercent`,
//! `imageGCLowThresholdPercent`, `imageMinimumGCAge` and `imageMaximumGCAge`, and how many pulls run at once,
//! from `serializeImagePulls` and `maxParallelImagePulls`; checked as the kubelet checks them. All apply on
//! reload.

use std::time::Duration;

use super::{duration_field, required};
use crate::{ConfigError, KubeletConfiguration};

/// The images section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImagesConfig {
    /// `imageGCHighThresholdPercent`: at this imagefs usage or above, unused images are removed; 100 turns the
    /// threshold off.
    pub high_percent: u8,
    /// `imageGCLowThresholdPercent`: the usage the collector frees down to.
    pub low_percent: u8,
    /// `imageMinimumGCAge`: an image first seen more recently than this is kept.
    pub minimum_age: Duration,
    /// `imageMaximumGCAge`: an image unused for longer than this is removed whatever the usage (`None`: `0s`,
    /// never).
    pub maximum_age: Option<Duration>,
    /// How many image pulls run at once: 1 with `serializeImagePulls`, else `maxParallelImagePulls` (`None`: no
    /// limit).
    pub parallel_pulls: Option<u32>,
}

impl ImagesConfig {
    /// The images section.
    pub fn validate(c: &KubeletConfiguration) -> Result<Self, ConfigError> {
        let high = *required(&c.image_gc_high_threshold_percent, "imageGCHighThresholdPercent")?;
        let low = *required(&c.image_gc_low_threshold_percent, "imageGCLowThresholdPercent")?;
        let percent = |field: &str, v: i64| {
            u8::try_from(v)
                .ok()
                .filter(|v| *v <= 100)
                .ok_or_else(|| ConfigError::field(field, format!("{v} is not between 0 and 100")))
        };
        let high_percent = percent("imageGCHighThresholdPercent", high)?;
        let low_percent = percent("imageGCLowThresholdPercent", low)?;
        if low_percent >= high_percent && high_percent != 100 {
            return Err(ConfigError::field(
                "imageGCLowThresholdPercent",
                format!("{low} must be less than imageGCHighThresholdPercent ({high})"),
            ));
        }
        let minimum_age = duration_field("imageMinimumGCAge", &c.image_minimum_gc_age)?;
        let maximum_age = match duration_field("imageMaximumGCAge", &c.image_maximum_gc_age)? {
            Duration::ZERO => None,
            max if max <= minimum_age => {
                return Err(ConfigError::field(
                    "imageMaximumGCAge",
                    format!("{max:?} must be greater than imageMinimumGCAge ({minimum_age:?})"),
                ));
            }
            max => Some(max),
        };
        let serialize = *required(&c.serialize_image_pulls, "serializeImagePulls")?;
        let parallel_pulls = match (serialize, c.max_parallel_image_pulls) {
            (_, Some(n)) if n < 1 => {
                return Err(ConfigError::field("maxParallelImagePulls", format!("{n} must be a positive number")));
            }
            (true, Some(n)) if n > 1 => {
                return Err(ConfigError::field(
                    "maxParallelImagePulls",
                    format!("{n} cannot be larger than 1 unless serializeImagePulls is false"),
                ));
            }
            (true, _) => Some(1),
            (false, n) => n.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        };
        Ok(ImagesConfig { high_percent, low_percent, minimum_age, maximum_age, parallel_pulls })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{assert_refused, raw};
    use super::*;

    #[test]
    fn the_kubelets_defaults_and_limits() {
        let i = ImagesConfig::validate(&raw("")).unwrap();
        let want = ImagesConfig {
            high_percent: 85,
            low_percent: 80,
            minimum_age: Duration::from_secs(120),
            maximum_age: None,
            parallel_pulls: Some(1),
        };
        assert_eq!(i, want);
        let pulls = |body: &str| ImagesConfig::validate(&raw(body)).unwrap().parallel_pulls;
        assert_eq!(pulls("serializeImagePulls: false\n"), None, "no limit");
        assert_eq!(pulls("serializeImagePulls: false\nmaxParallelImagePulls: 3\n"), Some(3));
        assert_eq!(pulls("maxParallelImagePulls: 1\n"), Some(1));
        assert_eq!(pulls("maxParallelImagePulls: 4\n"), Some(4), "serializeImagePulls then defaults to false");
        let i = ImagesConfig::validate(&raw("imageMaximumGCAge: 168h\nimageMinimumGCAge: 0s\n")).unwrap();
        assert_eq!((i.minimum_age, i.maximum_age), (Duration::ZERO, Some(Duration::from_secs(168 * 3600))));
        assert!(
            ImagesConfig::validate(&raw("imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 100\n")).is_ok()
        );
        assert_refused(
            ImagesConfig::validate,
            &[
                ("imageGCLowThresholdPercent: 90\n", "imageGCLowThresholdPercent"),
                ("imageGCHighThresholdPercent: 101\n", "imageGCHighThresholdPercent"),
                ("imageGCLowThresholdPercent: -1\n", "imageGCLowThresholdPercent"),
                ("imageMinimumGCAge: soon\n", "imageMinimumGCAge"),
                ("imageMaximumGCAge: 1m\n", "imageMaximumGCAge"),
                ("serializeImagePulls: true\nmaxParallelImagePulls: 2\n", "maxParallelImagePulls"),
                ("imageMinimumGCAge: 1h\nimageMaximumGCAge: 1h\n", "imageMaximumGCAge"),
                ("serializeImagePulls: false\nmaxParallelImagePulls: 0\n", "maxParallelImagePulls"),
            ],
        );
    }
}
