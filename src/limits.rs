//! Every bound in tbon lives here, so that a reader can see at a glance how much memory and time
//! the library may use, and what happens when a bound is reached (documented at each constant).
