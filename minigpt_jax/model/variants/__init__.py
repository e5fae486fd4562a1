"""The variants room: the built-in entries that are not the default GPT's (the document mask,
ALiBi, soft-cap and relative attention scores, the gated MLPs, the parallel block), named in
their registries' tables and imported only when a config picks one."""
