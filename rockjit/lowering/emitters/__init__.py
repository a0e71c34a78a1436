"""Per-op regcmd emitters. Each builds complete, self-contained tasks (regcmd.TaskBuilder) from a tile
description and the chip profile; none chooses tiles (that is the tiling pass's job) and none
holds a machine number of its own."""
