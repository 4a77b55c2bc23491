use super::*;
use parcae_consensus::state::{LayerRange, OptimizerScalars, StepEnd};

fn cut(history: u64, step: u64, digests: [u8; 2]) -> Cut {
    Cut {
        end: StepEnd {
            step,
            epoch: 1,
            sample_cursor: 16 * (step + 1),
            optimizer: OptimizerScalars::default(),
        },
        history,
        layers: 4,
        parts: digests
            .iter()
            .enumerate()
            .map(|(i, d)| CutPart {
                layers: LayerRange {
                    start: 2 * i as u32,
                    end: 2 * i as u32 + 2,
                },
                holders: Vec::new(),
                digest: [*d; 32],
                stored: true,
            })
            .collect(),
        groups: Vec::new(),
    }
}

#[tokio::test]
async fn an_s3_store_over_https_answers_with_an_error_not_a_panic() {
    // Nothing listens on port 9: the request must fail in the TLS client's connect, which
    // needs a crypto provider to exist at all.
    let options = [
        ("aws_endpoint", "https://127.0.0.1:9"),
        ("aws_access_key_id", "test"),
        ("aws_secret_access_key", "test"),
        ("aws_region", "us-east-1"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let (store, prefix) = open_url("s3://bucket/jobs", options).unwrap();
    assert_eq!(prefix.as_ref(), "jobs");
    let listed = store.list_with_delimiter(Some(&prefix)).await;
    assert!(listed.is_err(), "a closed port answered: {listed:?}");
}

async fn put(store: &JobStore, c: &Cut) {
    for p in &c.parts {
        let layers = p.layers.start..p.layers.end;
        store
            .put_part(c.steps_trained(), layers, &p.digest, vec![p.digest[0]; 8])
            .await
            .unwrap();
    }
    store.put_cut(c).await.unwrap();
}

#[tokio::test]
async fn the_newest_cut_of_the_latest_history_is_found_and_old_ones_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().join("store");
    let store = JobStore::open(location.to_str().unwrap(), &[7; 32]).unwrap();
    assert!(store.newest_cut().await.unwrap().is_none());
    put(&store, &cut(0, 9, [1, 2])).await;
    put(&store, &cut(0, 19, [3, 4])).await;
    put(&store, &cut(1, 14, [5, 6])).await;
    let newest = store.newest_cut().await.unwrap().unwrap();
    assert_eq!((newest.history, newest.end.step), (1, 14));
    let part = &newest.parts[1];
    assert_eq!(store.get_part(15, part, 1 << 20).await.unwrap(), vec![6; 8]);
    assert!(store.get_part(15, part, 4).await.is_err(), "over the bound");
    // The oldest cut's manifest and parts are gone; the two newest stay.
    let old = cut(0, 9, [1, 2]);
    assert!(store.get_part(10, &old.parts[0], 1 << 20).await.is_err());
    let kept = cut(0, 19, [3, 4]);
    assert!(store.get_part(20, &kept.parts[0], 1 << 20).await.is_ok());
    // Another job's directory is separate.
    let other = JobStore::open(location.to_str().unwrap(), &[8; 32]).unwrap();
    assert!(other.newest_cut().await.unwrap().is_none());
    // A damaged manifest is an error, not a silent fresh start.
    let manifest = location
        .join(hex::encode([7u8; 16]))
        .join("cuts")
        .join(format!("{:020}-{:020}.json", 1, 14));
    std::fs::write(&manifest, b"{").unwrap();
    assert!(store.newest_cut().await.is_err());
    assert_eq!(
        store
            .stored_cut(Some(20))
            .await
            .unwrap()
            .map(|c| c.end.step),
        Some(19),
        "a cut by its steps"
    );
    let found = JobStore::open_existing(location.to_str().unwrap(), None)
        .await
        .unwrap();
    assert_eq!(found.root, store.root, "the one job in the store");
    assert!(
        JobStore::open_existing(location.to_str().unwrap(), Some("zz"))
            .await
            .is_err()
    );
    assert!(JobStore::open("s3://", &[7; 32]).is_err());
    assert!(JobStore::open("ftp://host/x", &[7; 32]).is_err());
}

#[tokio::test]
async fn a_backup_s_newest_cut_is_copied_verified_and_found_by_a_stopped_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let open =
        |name: &str| JobStore::open(dir.path().join(name).to_str().unwrap(), &[7; 32]).unwrap();
    let (backup, live) = (open("backup"), open("live"));
    let bytes = [vec![1u8; 8], vec![2u8; 8]];
    let mut given = cut(0, 3, [0, 0]);
    for (p, b) in given.parts.iter_mut().zip(&bytes) {
        p.digest = Sha256::digest(b).into();
        let layers = p.layers.start..p.layers.end;
        backup
            .put_part(4, layers, &p.digest, b.clone())
            .await
            .unwrap();
    }
    backup.put_cut(&given).await.unwrap();
    put(&live, &cut(0, 9, [3, 4])).await;
    put(&live, &cut(0, 11, [5, 6])).await;
    let copied = live.copy_newest_from(&backup, 1 << 20).await.unwrap();
    assert_eq!(copied.as_ref(), Some(&given));
    let part = &given.parts[1];
    assert_eq!(live.get_part(4, part, 1 << 20).await.unwrap(), bytes[1]);
    let newest = live.newest_cut().await.unwrap().map(|c| c.end.step);
    assert_eq!(newest, Some(11), "the older copy is kept, not newest");
    let found = live.newest_cut_not_held(10, &[(0, 9)]).await.unwrap();
    assert_eq!(found.map(|c| c.end.step), Some(3), "11 is ahead, 9 held");
    let none = live
        .newest_cut_not_held(10, &[(0, 9), (0, 3)])
        .await
        .unwrap();
    assert!(none.is_none());
    // A backup part whose bytes are not its manifest's digest is not copied.
    put(&backup, &cut(0, 5, [9, 9])).await;
    let refused = live.copy_newest_from(&backup, 1 << 20).await.unwrap_err();
    assert!(refused.to_string().contains("do not match"), "{refused}");
}
