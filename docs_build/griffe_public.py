"""A griffe extension: the package's public names (`minigpt_jax._PUBLIC`, loaded on first use
through `__getattr__`) as aliases of their definitions, so the API reference can name them
`minigpt_jax.GPTConfig`, as a user imports them."""

import ast

import griffe


class PublicNames(griffe.Extension):
    def on_module_members(self, *, node, mod, agent, **kwargs) -> None:
        if mod.path != "minigpt_jax" or not isinstance(node, ast.Module):
            return
        for name, module in public_names(node).items():
            mod.set_member(name, griffe.Alias(name, f"{module}.{name}", parent=mod))


def public_names(tree: ast.Module) -> dict[str, str]:
    """{name: defining module} from the module's `_PUBLIC = {...}` literal."""
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_PUBLIC" for t in statement.targets
        ):
            return ast.literal_eval(statement.value)
    raise ValueError("minigpt_jax/__init__.py has no _PUBLIC = {...} literal")
