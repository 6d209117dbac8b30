//! Mediation as the product runs it: lw-mediate's record and secrets, the
//! courier's junk, gVisor's posts, the radar's hold.  One binary, a module
//! per suite (its tests run on parallel threads); the flood (door_flood) is a
//! binary of its own.

mod courier_junk;
mod door_gvisor;
mod door_record;
mod radar_mediate;
mod secrets_door;
