"""Models for projections in virtual time (docs/simulate.md): resources that charge time,
and the devices, network and nodes built from them."""
