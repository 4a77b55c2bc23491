//! What a repartition moves when every node of the new configuration fetches the layers it
//! lacks from the live holders at once ([`super::super::RepartitionRule::Handoff`], how
//! `parcae-node` moves state): the slots of each new stage go to the survivors whose old layers
//! cover it best, each slot fetches the rest, spread over every holder of those layers (the
//! nodes of the old configuration, those leaving included: they hand their state off before
//! their deadline), and the transfers run in parallel, each node's link carrying what it
//! receives and what it sends.

/// The largest volume (parameters) any node receives and any holder sends in one scenario:
/// `lists[s]` ranks the old stages for new stage `s` by the parameters `s` would lack on a node
/// of each (fewest first, every old stage listed), `need[s]` is new stage `s`'s parameters,
/// `lost[j]` the nodes old stage `j` lost of its `old_d`, and `new_d` the new pipelines.
/// Each new stage takes its `new_d` slots' nodes from the old stages in its order, as far as
/// their survivors last (those an earlier new stage took are gone), then nodes that hold nothing
/// (spares, newcomers); old stage `j`'s layers go, to every slot not on a node of `j`, from
/// `j`'s `old_d` holders evenly.
pub fn moved_params(
    lists: &[Vec<(u32, f64)>],
    need: &[f64],
    lost: &[u32],
    old_d: u32,
    new_d: u32,
) -> (f64, f64) {
    let mut left: Vec<u32> = lost.iter().map(|&k| old_d.saturating_sub(k)).collect();
    let mut sent = vec![0.0f64; lost.len()];
    let mut received = 0.0f64;
    for (choices, &stage) in lists.iter().zip(need) {
        let mut want = new_d;
        for &(j, miss) in choices {
            let j = j as usize;
            let taken = want.min(left[j]);
            left[j] -= taken;
            want -= taken;
            if taken > 0 {
                received = received.max(miss);
            }
            let overlap = stage - miss;
            sent[j] += f64::from(new_d - taken) * overlap;
        }
        if want > 0 {
            received = received.max(stage);
        }
    }
    let most_sent = sent.iter().copied().fold(0.0, f64::max) / f64::from(old_d.max(1));
    (received, most_sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survivors_keep_what_they_hold_and_every_holder_shares_the_rest() {
        // Old: two stages of two replicas, 10 parameters each. New: one stage of 20 on two
        // pipelines, which lacks 10 on a node of either old stage.
        let lists = vec![vec![(0, 10.0), (1, 10.0)]];
        let need = [20.0];
        // Nothing lost: both slots go to nodes of old stage 0, which fetch old stage 1's 10
        // from its two holders (one slot each).
        assert_eq!(moved_params(&lists, &need, &[0, 0], 2, 2), (10.0, 10.0));
        // Old stage 0 lost both: the slots go to old stage 1's nodes, which fetch stage 0's
        // layers from its two holders (leaving, they still hand off).
        assert_eq!(moved_params(&lists, &need, &[2, 0], 2, 2), (10.0, 10.0));
        // Three pipelines and one survivor in all (of old stage 0): two slots on nodes that
        // hold nothing receive the whole stage; old stage 1's 10 go to all three slots from
        // its two holders, 15 each.
        assert_eq!(moved_params(&lists, &need, &[1, 2], 2, 3), (20.0, 15.0));
    }

    #[test]
    fn an_unchanged_stage_moves_nothing() {
        let lists = vec![vec![(0, 0.0), (1, 10.0)], vec![(1, 0.0), (0, 10.0)]];
        assert_eq!(
            moved_params(&lists, &[10.0, 10.0], &[0, 0], 2, 2),
            (0.0, 0.0)
        );
    }
}
