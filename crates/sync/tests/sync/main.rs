//! lw-sync against lw-github-sink on 127.0.0.1 (comments, reviews, pulls,
//! limits, status, watch, kill).  One binary, a module per
//! suite (its tests run on parallel threads).

mod sync_door;
mod sync_flow;
mod sync_kill;
mod sync_limits;
mod sync_reviews;
mod sync_sink;
mod sync_sink_pulls;
mod sync_status;
mod sync_watch;
