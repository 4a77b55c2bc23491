//! Cloud regions from zone names. Zones of one region share the region's network (a round trip
//! of about a millisecond, billed as traffic between zones); zones of two regions cross the
//! cloud's network between regions (tens of milliseconds, billed as traffic between regions).
//! The region is read from a zone's name as each cloud writes it:
//!
//! - AWS availability zones, `us-east-1a` (region `us-east-1`), and zone ids, `use1-az4`
//!   (`use1`);
//! - GCE zones, `us-central1-a` (`us-central1`);
//! - Azure zones as a region and a zone number, `eastus-1` (`eastus`).
//!
//! A name in none of these forms has no known region: it is priced as another zone of the same
//! region, as every zone was before regions.

/// The region of `zone`, when its name is in one of the clouds' forms.
pub fn region_of(zone: &str) -> Option<&str> {
    let parts: Vec<&str> = zone.split('-').collect();
    let letters = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_lowercase());
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    // Letters, then digits: GCE's `central1`, an AWS zone id's `use1`.
    let word_number = |s: &str| {
        let split = s.find(|c: char| c.is_ascii_digit()).unwrap_or(s.len());
        letters(&s[..split]) && digits(&s[split..])
    };
    let without_last = |n: usize| &zone[..zone.len() - n];
    match parts.as_slice() {
        // AWS: `us-east-1a`, `us-gov-west-1a`: words, then the region's number and the zone's
        // letter.
        [first, middle @ .., last] if parts.len() >= 3 && first.len() == 2 => {
            let (number, letter) = last.split_at(last.len().saturating_sub(1));
            let aws = middle.iter().all(|p| letters(p)) && digits(number) && letters(letter);
            let gce = middle.len() == 1 && word_number(middle[0]) && last.len() == 1;
            if aws {
                Some(without_last(1))
            } else if gce && letters(last) {
                Some(without_last(2))
            } else {
                None
            }
        }
        // GCE outside the two-letter prefixes: `europe-west4-b`, `northamerica-northeast1-a`.
        [first, middle, last] if letters(first) && word_number(middle) && last.len() == 1 => {
            letters(last).then(|| without_last(2))
        }
        // AWS zone ids, `use1-az4`.
        [region, id] if word_number(region) && id.strip_prefix("az").is_some_and(digits) => {
            Some(region)
        }
        // Azure, `eastus-1`: a region and a zone number.
        [region, number] if letters(region) || word_number(region) => {
            (digits(number) && number.len() <= 2).then_some(*region)
        }
        _ => None,
    }
}

/// Whether `a` and `b` are zones of two regions (both known).
pub fn regions_apart(a: &str, b: &str) -> bool {
    matches!((region_of(a), region_of(b)), (Some(x), Some(y)) if x != y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cloud_s_zone_names_give_their_region() {
        for (zone, region) in [
            ("us-east-1a", "us-east-1"),
            ("us-west-2d", "us-west-2"),
            ("us-gov-west-1a", "us-gov-west-1"),
            ("ap-northeast-1c", "ap-northeast-1"),
            ("use1-az4", "use1"),
            ("us-central1-a", "us-central1"),
            ("europe-west4-b", "europe-west4"),
            ("northamerica-northeast1-a", "northamerica-northeast1"),
            ("eastus-1", "eastus"),
            ("westeurope-3", "westeurope"),
            ("eastus2-1", "eastus2"),
        ] {
            assert_eq!(region_of(zone), Some(region), "{zone}");
        }
    }

    #[test]
    fn other_names_have_no_region() {
        for zone in [
            "a",
            "fast",
            "zone",
            "us-east-1-bos-1a",
            "us-east",
            "eastus-123",
            "-1",
            "",
        ] {
            assert_eq!(region_of(zone), None, "{zone}");
        }
    }

    #[test]
    fn zones_are_apart_only_when_both_regions_are_known_and_differ() {
        assert!(regions_apart("us-east-1a", "us-west-2a"));
        assert!(regions_apart("us-east-1a", "us-central1-a"));
        assert!(!regions_apart("us-east-1a", "us-east-1b"));
        assert!(!regions_apart("us-east-1a", "b"));
        assert!(!regions_apart("a", "b"));
    }
}
