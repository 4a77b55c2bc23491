//! `parcae-testnet run`: one trace replayed on a local cluster, and the pieces `compare` and
//! `chaos` share with it (one supervised session, the simulator's account of it, the table).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use parcae_api::StepRecord;
use parcae_outer::Wire;
use parcae_strategies::cost::money::{self, OnDemand, Prices};
use parcae_strategies::sim::StrategyRun;

use crate::cluster::{Cluster, ClusterOptions};
use crate::engine::{self, Observed, Scenario};
use crate::fidelity;
use crate::gpus;
use crate::history::{self, RunHistory};
use crate::model_replay;
use crate::node_args::{NodeArgs, OutputArgs, STRATEGIES};
use crate::node_bin;
use crate::node_config::NodeSettings;
use crate::predicted;
use crate::prices::{PriceArgs, names_zones, pools_named, zone_prices};
use crate::process::{self, RunDir, STORE};
use crate::progress::Progress;
use crate::replay::Replay;
use crate::report::{self, RunMeta, RunReport};
use crate::run_check;
use crate::simulate::zones::parse_zone;
use crate::trace_plan::{Planned, TraceArgs, plan_trace};
use parcae_strategies::cost::objective::{Objective, ObjectiveKind};
use parcae_testnet::interrupt::Interrupt;
use parcae_testnet::local_cluster::Ports;

/// Options of `run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    trace: TraceArgs,
    /// Planning strategy of the nodes: liveput (proactive, the zone forecast with notices),
    /// liveput-predict (proactive, Parcae's ARIMA predictor) or reactive (restart on changes).
    #[arg(long, default_value = "liveput", value_parser = STRATEGIES)]
    strategy: String,
    /// SIGKILL the cluster's leader, without notice, this many seconds into the replay; the
    /// report times the failover (`--check` fails above 5 s) and lists every re-plan.
    #[arg(long)]
    kill_leader_at: Option<f64>,
    /// After the run, check its history and train it again in one process on the nodes'
    /// device (`parcae-node replay`): the weights and losses of every committed step against
    /// the cluster's checkpoints, which the job's store then keeps all of (with `--check`, a
    /// failed replay fails the run).
    #[arg(long)]
    replay: bool,
    /// Zones of the run, `NAME=TRACE,...` in place of --trace: each zone replays its own trace
    /// (windowed and fitted to --nodes-max as --trace is), its nodes started in it
    /// (`[placement] zone`) and preempted among its own; the founder stays. With --emulate,
    /// `NAME=TRACE@SPEED` gives a zone's nodes an emulated device SPEED times as fast as the
    /// profiled one, and what crosses zones is paced on the cloud's link between zones.
    #[arg(long, value_delimiter = ',')]
    zones: Vec<String>,
    #[command(flatten)]
    node: NodeArgs,
    #[command(flatten)]
    prices: PriceArgs,
    #[command(flatten)]
    output: OutputArgs,
}

/// A finished session.
pub struct Outcome {
    /// Name of the run ([`SessionSpec::label`]).
    pub label: String,
    /// The JSON report.
    pub report: RunReport,
    /// What the table shows besides the JSON.
    pub details: report::Details,
    /// Everything observed.
    pub observed: Observed,
    /// Wall-clock seconds of one replayed interval.
    pub interval_secs: f64,
    /// The run directory (removed with the outcome unless `--work-dir` keeps it).
    pub dir: RunDir,
    /// The simulator's run of the same strategy on the same trace and cost model, if any
    /// ([`simulate_sessions`]).
    pub simulated: Option<StrategyRun>,
}

/// What a session replays and how it is named in the report.
pub struct SessionSpec<'a> {
    /// Strategy given to the nodes.
    pub strategy: &'a str,
    /// Name of the run: its directory, its progress line and its plot.
    pub label: String,
    /// Trace name in the report.
    pub trace: String,
    /// Planning intervals in the report.
    pub intervals: u64,
    /// Most nodes in the report.
    pub nodes_max: u32,
}

/// Runs one supervised cluster session: every node is killed when this returns, whatever
/// happened. The run directory goes with the outcome unless `--work-dir` was given (and stays
/// for its logs when the session fails).
pub fn session(
    node: &NodeArgs,
    spec: SessionSpec<'_>,
    scenario: &mut dyn Scenario,
    interrupt: &Interrupt,
) -> Result<Outcome> {
    let bin = node_bin::locate(node.node_bin.as_deref())?;
    // The wall clock starts after a possible build of the node.
    let started = Instant::now();
    let dir = process::run_dir(node.work_dir.as_deref(), &spec.label)
        .context("creating the run directory")?;
    let zones: Vec<(String, f64)> = scenario
        .zones()
        .into_iter()
        .map(|z| (z.name, z.speed))
        .collect();
    let settings = NodeSettings {
        checkpoint_store: Some(dir.join(STORE)),
        keep_checkpoints: scenario.keeps_every_checkpoint().then_some(0),
        zone_prices: planned_prices(node, &zones)?,
        zones,
        ..node.settings(spec.strategy, spec.nodes_max)?
    };
    let opts = ClusterOptions {
        bin,
        dir: dir.clone(),
        settings,
        notice: node.notice,
        ports: match (node.netns, node.base_port) {
            (true, _) => Ports::Namespaces,
            (false, Some(base)) => Ports::Base(base),
            (false, None) => Ports::Ephemeral,
        },
        checkpoint_disk_mib: scenario.checkpoint_disk_mib(),
        clock_skew: scenario.clock_skew(),
    };
    let result = (|| -> Result<Observed> {
        let mut cluster = Cluster::create(opts, interrupt.clone())?;
        let mut progress = Progress::new(&spec.label);
        let observed = engine::execute(&mut cluster, scenario, interrupt, &mut progress)?;
        cluster.shutdown();
        Ok(observed)
    })();
    let observed = result.with_context(|| format!("node logs are in {}", dir.display()))?;
    let dir = RunDir::new(dir, node.work_dir.is_some());
    let meta = RunMeta {
        strategy: spec.strategy.to_string(),
        trace: spec.trace,
        intervals: spec.intervals,
        nodes_max: spec.nodes_max,
        wall_secs: started.elapsed().as_secs_f64(),
        sync: node.sync.to_string(),
        seed: node.seed,
        outer: node
            .outer_lr
            .zip(node.outer_momentum)
            .map(|(lr, m)| [lr, m]),
        pseudo_gradient: node.sync.inner_steps().map(|_| node.pseudo_gradient),
    };
    let (report, details) = report::build(meta, &observed);
    Ok(Outcome {
        label: spec.label,
        report,
        details,
        observed,
        interval_secs: node.interval_secs as f64,
        dir,
        simulated: None,
    })
}

/// Gives every session replaying `planned` the simulator's account of it
/// ([`crate::predicted`]): its strategy on the same trace, under the emulated profile's cost
/// model (the simulated interval is the emulated one), or on CPUs under the model measured on
/// these sessions together; its share of the simulator's ideal; and with `prices`, its bill in
/// the same world (the replayed machines held for the emulated or real intervals, the on-demand
/// baseline at that model's throughput-optimal configuration). Without a model (a CPU run too
/// short to measure a configuration) there is no simulation and the bill has no saving.
pub fn simulate_sessions(
    outcomes: &mut [Outcome],
    node: &NodeArgs,
    planned: &Planned,
    nodes_max: u32,
    prices: Option<Prices>,
) {
    let (model, time_scale) = match &node.emulate {
        Some(profile) => (
            predicted::emulated_model(profile, nodes_max),
            node.time_scale,
        ),
        None => {
            let observed: Vec<&Observed> = outcomes.iter().map(|o| &o.observed).collect();
            (predicted::measured_model(&node.model, &observed), 1.0)
        }
    };
    let interval_secs = node.interval_secs as f64 * time_scale;
    let held = money::machine_hours(planned.counts.iter().copied(), interval_secs);
    let on_demand = model.as_ref().map(|m| OnDemand::of(m, nodes_max));
    for o in outcomes.iter_mut() {
        o.report.cost = prices.map(|p| money::bill(held, o.report.samples as f64, p, on_demand));
    }
    let Some(model) = model.map(Arc::new) else {
        return;
    };
    let trace = predicted::replayed_trace(
        &planned.source,
        &planned.counts,
        interval_secs.round().max(1.0) as u64,
    );
    let simulate =
        |strategy: &str| predicted::simulate(&model, &trace, nodes_max, node.seed, strategy);
    let ideal = simulate("ideal").map_or(0.0, |r| r.samples);
    for o in outcomes {
        if let Some(run) = simulate(&o.report.strategy) {
            o.report.compare_with_simulator(run.samples, ideal);
            o.report.fidelity = Some(fidelity::ledger(&fidelity::Inputs {
                timeline: &o.observed.monitor.timeline,
                events: &o.observed.monitor.events,
                reconfigurations: &o.report.reconfigurations,
                simulated: &run,
                model: &model,
                interval_secs: node.interval_secs as f64,
                time_scale,
                samples: o.report.samples,
                rolled_back_steps: o.report.rolled_back_steps,
            }));
            o.simulated = Some(run);
        }
    }
}

/// Gives an emulated run over zones the fleet simulator's account of it
/// ([`predicted::zones`]): its strategy on each zone's replayed counts, each zone's device at
/// its speed, the interval the emulated one.
fn simulate_zoned_session(outcome: &mut Outcome, node: &NodeArgs, profile: &str, replay: &Replay) {
    let interval_secs = node.interval_secs as f64 * node.time_scale;
    let zones = replay.replayed_zones();
    let strategy = outcome.report.strategy.clone();
    let names: Vec<&str> = zones.iter().map(|z| z.name).collect();
    // The run's zones were checked priced when it was planned.
    let prices = pools_named(&names).and_then(|pools| zone_prices(&node.spot_prices, &pools));
    let objective = match prices {
        Ok(Some(usd_per_node_hour)) if node.objective == ObjectiveKind::SamplesPerDollar => {
            Objective::SamplesPerDollar { usd_per_node_hour }
        }
        _ => Objective::Samples,
    };
    let account = predicted::zones::simulate(
        profile,
        &zones,
        interval_secs,
        node.seed,
        &strategy,
        (&objective, !node.flat_rings),
    );
    if let Some(run) = account {
        outcome.report.compare_with_simulator(run.samples, 0.0);
        outcome.simulated = Some(run);
    }
}

/// Checks the history of `outcome` (`minority_seen`: what cut-off sides applied, where the
/// network split) and, unless the model was emulated, trains it again in one process on the
/// nodes' device; prints the verdict, puts it in the report and keeps the history in a kept
/// run directory.
pub fn verify_history(
    outcome: &mut Outcome,
    minority_seen: Option<Vec<StepRecord>>,
    node: &NodeArgs,
) -> Result<()> {
    let history = RunHistory {
        ledger: outcome.observed.monitor.steps.clone(),
        final_seq: outcome.observed.final_seq.clone(),
        minority_seen,
        sync: node.sync,
    };
    let mut verdict = history::check(&history);
    // An emulated GPT is paced to a large model's profile but is a real model of its layer
    // count: replaying it on one CPU would take longer than the run. Under DiLoCo the replay
    // trains each group apart (from the seeded start, and from checkpoints every group resumed
    // from), and only where the rounds sent f32: the cluster rounds a lossy form's partial sums
    // hop by hop; the rounds are checked by the outer weights every node shows besides (the
    // report's outer_rounds).
    let rounds_replayable = node.sync.inner_steps().is_none() || node.pseudo_gradient == Wire::F32;
    if node.emulate.is_none() && rounds_replayable {
        let bin = node_bin::locate(node.node_bin.as_deref())?;
        let device = node.device.devices(gpus::visible).replay_device();
        let replayed = model_replay::run(&bin, outcome.dir.path(), &history.final_seq, &device);
        history::with_replay(&mut verdict, replayed);
    }
    println!("{}", history::summary(&verdict));
    if let Some(dir) = outcome.dir.kept() {
        history::write(dir, &history)?;
        println!("history kept: parcae-testnet check {}", dir.display());
    }
    outcome.report.minority_commits = verdict.minority_commits;
    outcome.report.history_check = Some(verdict);
    Ok(())
}

/// Writes the plots of one session into `dir` as `<name>.png`.
pub fn write_plots(dir: &Path, name: &str, outcome: &Outcome, title: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{name}.png"));
    let simulated = outcome
        .simulated
        .as_ref()
        .map(|run| (run.configs.as_slice(), outcome.interval_secs));
    crate::plot::testnet_run(&path, title, &outcome.observed, simulated)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// `parcae-testnet run`.
pub fn run(mut args: Args, interrupt: &Interrupt) -> Result<()> {
    args.prices.prices()?;
    args.node.spot_prices = args.prices.price_spot.clone();
    args.node.validate()?;
    let (planned, mut scenario) = replay_of(&args.zones, &args.trace, &args.node)?;
    let nodes_max = nodes_max_of(&args.zones, &args.trace);
    if let Some(at) = args.kill_leader_at {
        let end = planned.counts.len() as f64 * args.node.interval_secs as f64;
        if !(at.is_finite() && at >= 0.0 && at < end) {
            bail!("--kill-leader-at {at}: must be within the replay's {end} s");
        }
        scenario = scenario.kill_leader_at(at);
    }
    if args.replay {
        scenario = scenario.keeping_every_checkpoint();
    }
    if args.node.samples.is_some() {
        scenario = scenario.ending_with_the_job();
    }
    let spec = SessionSpec {
        strategy: &args.strategy,
        label: args.strategy.clone(),
        trace: planned.source.clone(),
        intervals: planned.counts.len() as u64,
        nodes_max,
    };
    let mut outcomes = [session(&args.node, spec, &mut scenario, interrupt)?];
    if args.replay {
        verify_history(&mut outcomes[0], None, &args.node)?;
    }
    hold_to_simulator(
        &mut outcomes,
        &args.node,
        &planned,
        nodes_max,
        args.prices.prices()?,
        &scenario,
    );
    let [outcome] = outcomes;
    finish(&[&outcome], &args.output, &planned.source)?;
    if let Some(path) = &args.output.json {
        report::write_json(path, &outcome.report)?;
    }
    if args.output.check
        && args.kill_leader_at.is_some()
        && outcome.report.leader_failover.is_none()
    {
        bail!("--kill-leader-at: no node led the cluster to be killed");
    }
    check(&[&outcome], &args.output)
}

/// The replay of `trace`, or with `zones` (`--zones`) of each zone's trace.
pub fn replay_of(
    zones: &[String],
    trace: &TraceArgs,
    node: &NodeArgs,
) -> Result<(Planned, Replay)> {
    if !zones.is_empty() {
        return zoned_replay(zones, trace, node);
    }
    if names_zones(&node.spot_prices) {
        bail!("--price-spot ZONE=USD prices the zones of a run: give them with --zones");
    }
    let planned = plan_trace(trace)?;
    let replay = Replay::new(
        planned.counts.clone(),
        node.interval_secs as f64,
        node.grace_secs,
        node.seed,
    );
    Ok((planned, replay))
}

/// The most nodes the cluster asks for: each zone is fitted to --nodes-max.
pub fn nodes_max_of(zones: &[String], trace: &TraceArgs) -> u32 {
    trace.nodes_max * zones.len().max(1) as u32
}

/// Gives every session of `replay` the simulator's account of it: an emulated run over zones
/// the fleet simulator's ([`simulate_zoned_session`]); any other run the single-cluster
/// simulator's on the pooled counts ([`simulate_sessions`]: zones of CPU nodes run alike
/// devices and links, one cluster to the simulator). An emulated DiLoCo run has none: its
/// groups step together and wait for every round, where the fleet simulator's DiLoCo trains
/// each pool at its own pace (`strategies::sim::diloco`) and the emulated profile's cost model
/// knows no rounds; a CPU run's measured model has its rounds in its measured throughput.
pub fn hold_to_simulator(
    outcomes: &mut [Outcome],
    node: &NodeArgs,
    planned: &Planned,
    nodes_max: u32,
    prices: Option<Prices>,
    replay: &Replay,
) {
    match &node.emulate {
        Some(_) if node.sync.inner_steps().is_some() => println!(
            "no simulated account of an emulated --sync {}: the simulator's DiLoCo paces its \
             groups apart, the nodes step together",
            node.sync
        ),
        Some(profile) if !replay.replayed_zones().is_empty() => {
            for o in outcomes {
                simulate_zoned_session(o, node, profile, replay);
            }
        }
        _ => simulate_sessions(outcomes, node, planned, nodes_max, prices),
    }
}

/// What the nodes' planners price each of `zones` at: with --objective samples-per-dollar,
/// its spot price; else none (they plan for samples).
fn planned_prices(node: &NodeArgs, zones: &[(String, f64)]) -> Result<Vec<(String, f64)>> {
    if node.objective != ObjectiveKind::SamplesPerDollar {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = zones.iter().map(|(n, _)| n.as_str()).collect();
    let prices = zone_prices(&node.spot_prices, &pools_named(&names)?)?.unwrap_or_default();
    Ok(names
        .iter()
        .zip(prices)
        .map(|(n, usd)| ((*n).to_string(), usd))
        .collect())
}

/// `--zones`: each zone's trace planned as `--trace` would be, the zones replayed together;
/// the pooled counts stand for the run in the report.
fn zoned_replay(texts: &[String], trace: &TraceArgs, node: &NodeArgs) -> Result<(Planned, Replay)> {
    check_groups_fit(node, trace.nodes_max)?;
    let mut zones = Vec::with_capacity(texts.len());
    let mut sources = Vec::with_capacity(texts.len());
    let mut speeds = Vec::with_capacity(texts.len());
    for text in texts {
        let zone = parse_zone(text)?;
        if zone.memory_gib.is_some() {
            bail!(
                "zone {text:?}: a zone's emulated device keeps the profile's memory (no /MEMORY_GIB)"
            );
        }
        if zone.speed != 1.0 && node.emulate.is_none() {
            bail!(
                "zone {text:?}: a device speed (@{}) needs --emulate",
                zone.speed
            );
        }
        speeds.push(zone.speed);
        let planned = plan_trace(&TraceArgs {
            trace: zone.trace,
            ..trace.clone()
        })
        .with_context(|| format!("zone {}", zone.pool))?;
        sources.push(format!("{}={}", zone.pool, planned.source));
        zones.push((zone.pool.to_string(), planned.counts));
    }
    if zones
        .iter()
        .enumerate()
        .any(|(i, (n, _))| zones[..i].iter().any(|(m, _)| m == n))
    {
        bail!("--zones names a zone twice");
    }
    let names: Vec<&str> = zones.iter().map(|(n, _)| n.as_str()).collect();
    zone_prices(&node.spot_prices, &pools_named(&names)?)?;
    let replay = Replay::zoned(
        zones,
        speeds,
        node.interval_secs as f64,
        node.grace_secs,
        node.seed,
    );
    let planned = Planned {
        source: sources.join(" + "),
        counts: replay.counts().to_vec(),
    };
    Ok((planned, replay))
}

/// Refuses an emulated DiLoCo run over zones that can never hold a whole pipeline: under
/// DiLoCo the planner lays zone pipelines alone, so a zone of fewer nodes than the profile's
/// shallowest pipeline would never train, and with every zone so the run would plan nothing.
fn check_groups_fit(node: &NodeArgs, nodes_max: u32) -> Result<()> {
    let (Some(profile), Some(_)) = (&node.emulate, node.sync.inner_steps()) else {
        return Ok(());
    };
    let shallowest = parcae_strategies::cost::profile::emulated(profile)
        .with_context(|| format!("--emulate {profile}"))?
        .spec
        .depths
        .iter()
        .copied()
        .min()
        .unwrap_or(1);
    if nodes_max < shallowest {
        bail!(
            "--sync {} with --emulate {profile}: under DiLoCo a zone trains whole pipelines \
             only, and {profile}'s shallowest is {shallowest} stages; give --nodes-max \
             {shallowest} or more",
            node.sync
        );
    }
    Ok(())
}

/// Prints the table, writes plots of the sessions, and applies `--check` (after the JSON
/// was written by the caller, so a failed check still leaves the report behind).
pub fn check(outcomes: &[&Outcome], output: &OutputArgs) -> Result<()> {
    if output.check {
        for o in outcomes {
            run_check::check(&o.report).map_err(anyhow::Error::msg)?;
        }
    }
    Ok(())
}

/// Prints the table and writes plots of the sessions.
pub fn finish(outcomes: &[&Outcome], output: &OutputArgs, title: &str) -> Result<()> {
    let rows: Vec<(&RunReport, u64)> = outcomes
        .iter()
        .map(|o| (&o.report, o.details.gaps))
        .collect();
    report::print_table(&rows);
    for o in outcomes {
        println!("{}", report::summary(&o.report));
        if let Some(f) = &o.report.fidelity {
            println!("{}", fidelity::summary(&o.report.strategy, f));
        }
    }
    for o in outcomes {
        if !o.report.reconfigurations.is_empty() {
            let replans: Vec<String> = o
                .report
                .reconfigurations
                .iter()
                .map(|r| format!("{:.0} s {:?} {:.1} s", r.seen_at_secs, r.kind, r.secs))
                .collect();
            println!("re-plans ({}): {}", o.report.strategy, replans.join(", "));
        }
        for w in &o.observed.warnings {
            println!("warning ({}): {w}", o.report.strategy);
        }
        for l in &o.details.lost {
            println!("LOST ({}): {l}", o.report.strategy);
        }
    }
    if let Some(dir) = &output.out {
        for o in outcomes {
            let path = write_plots(dir, &o.label, o, title)?;
            println!("plot: {}", path.display());
        }
    }
    Ok(())
}
