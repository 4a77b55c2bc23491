//! Preemption notices: the signed notice a leaving node gossips ([`notice`]), and the watcher
//! that turns "this machine is going away" into one request to leave ([`watcher`]): SIGTERM
//! and SIGINT, and the cloud's metadata service ([`cloud`], the one [`detect`] finds).

pub mod cloud;
pub mod detect;
pub mod notice;
pub mod watcher;

pub use notice::Notice;
pub use watcher::{LeaveRequested, NoticeWatcher};
