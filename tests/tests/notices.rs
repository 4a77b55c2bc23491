//! Cloud preemption notices: a local fake AWS metadata server (IMDSv2, the testnet's) triggers
//! the same flow as SIGTERM: gossip, `Notice` in raft, exit 0 at the deadline; and it tells the
//! node its zone and instance type, which the membership records.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parcae_api::MemberState;
use parcae_testnet::imds::{FakeCloud, FakeMetadata};
use parcae_tests::{TEST_CONFIG, secs, serial, start_cluster, wait_for};

#[test]
fn fake_aws_spot_notice_triggers_the_notice_flow() {
    let _serial = serial();
    let imds = FakeMetadata::aws().expect("fake metadata server");

    let mut c = start_cluster(TEST_CONFIG, 3);
    c.wait_converged(&[0, 1, 2], 3, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no cluster\n{}", c.logs()));
    let founder = c.nodes[0].p2p_addr().expect("addr");
    let spot = c
        .spawn_with_config(
            &[founder],
            &format!(
                "{TEST_CONFIG}[notices]\npoll_interval_ms = 200\naws_base_url = \"{}\"\n",
                imds.url()
            ),
        )
        .expect("spawn");
    c.wait_converged(&[0, 1, 2, spot], 4, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("spot node did not join\n{}", c.logs()));
    let peer = c.nodes[spot].peer_id().expect("peer id");
    assert!(
        c.nodes[spot].running(),
        "404 from the metadata service means no notice"
    );
    // The metadata service also says where the machine runs, and the membership records it;
    // the nodes without one say nothing.
    let (zone, instance_type) = FakeCloud::Aws.placement();
    wait_for(Duration::from_secs(10), || {
        let s = c.nodes[0].status()?;
        let placed = s.members.iter().all(|m| {
            let p = &m.placement;
            if m.peer_id == peer {
                (p.zone.as_str(), p.instance_type.as_str()) == (zone, instance_type)
            } else {
                p.zone.is_empty() && p.instance_type.is_empty() && p.device == "cpu"
            }
        });
        placed.then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the spot node's placement is not in the membership\n{}",
            c.logs()
        )
    });

    let deadline = SystemTime::now() + secs(20);
    imds.arm(deadline);
    let deadline_ms = deadline
        .duration_since(UNIX_EPOCH)
        .expect("epoch")
        .as_secs()
        * 1000;
    for i in 0..3 {
        wait_for(Duration::from_secs(5), || {
            let s = c.nodes[i].status()?;
            let gossiped = s
                .notices
                .iter()
                .any(|n| n.peer_id == peer && n.deadline_unix_ms == deadline_ms);
            let replicated = s.members.iter().any(|m| {
                m.peer_id == peer
                    && m.status == MemberState::Leaving
                    && m.deadline_unix_ms == Some(deadline_ms)
            });
            (gossiped && replicated).then_some(())
        })
        .unwrap_or_else(|| panic!("node {i} did not learn the AWS notice\n{}", c.logs()));
    }
    let s = c.nodes[spot].status().expect("status");
    assert_eq!(s.leaving_deadline_unix_ms, Some(deadline_ms));
    assert!(
        c.nodes[spot].running(),
        "the node serves until its deadline"
    );
}
