//! demo (wip)
