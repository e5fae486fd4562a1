"""The lab page's words in English and Spanish; `message(lang, key, **params)` formats one."""

from __future__ import annotations

LANGUAGES = ("en", "es")

TEXT: dict[str, dict[str, str]] = {
    "en": {
        # ---- page
        "title": "minigpt-jax embedding lab",
        "intro": (
            "Six tokens, six coordinates each: one embedding table W_E (6×6) shared by every part "
            "of this page. Renaming ids, editing a coordinate and taking a training step all change "
            "that one table, and the later parts read it. Every number here is computed by "
            "minigpt_jax's JAX code (the same functions as `experiments/`)."
        ),
        "table_heading": "The shared table W_E (rows: token ids, columns: coordinates)",
        "error_prefix": "Input error",
        "kept_state": "nothing was changed.",
        # ---- 1. lookup
        "lookup_heading": "1. Lookup: a token id reads one row of the table",
        "lookup_ids": "Token ids (a list, e.g. [0, 1, 0])",
        "lookup_button": "Look up",
        "lookup_rows": "Rows read (highlighted)",
        "lookup_result": "The result x, shape ({t}, {d}): row t is W_E[id_t]",
        "lookup_one_hot": "max |x − one_hot(ids) · W_E| = {diff:g}: the lookup equals the one-hot product.",
        "lookup_repeat": "Id {id} ({word}) repeats at positions {positions}: identical vectors (max difference {diff:g}).",
        "lookup_no_repeat": "No id repeats; type one twice, e.g. [0, 1, 0], to see identical vectors.",
        # ---- 2. rename
        "rename_heading": "2. Rename the ids: ids are only names for rows",
        "rename_ids": "Token ids to look up",
        "rename_perm": "Permutation π (id i becomes π[i]), e.g. [5, 3, 0, 1, 2, 4]",
        "rename_mode": "Rename",
        "mode_both": "ids and rows together",
        "mode_ids": "only the ids",
        "mode_rows": "only the rows",
        "rename_button": "Rename",
        "rename_before": "Before: ids {ids}",
        "rename_after": "After: ids {ids}",
        "rename_same": "max |x_after − x_before| = {diff:g}: the result is unchanged.",
        "rename_changed": "max |x_after − x_before| = {diff:g}: the result changed, because only one side was renamed.",
        "rename_applied": "The shared table and its vocabulary now use the new ids.",
        "rename_not_applied": "This was a what-if: the shared table is unchanged.",
        # ---- 3. edit
        "edit_heading": "3. Edit a coordinate: every occurrence of that token changes, nothing else",
        "edit_ids": "Token ids to look up",
        "edit_row": "Row (token id)",
        "edit_dim": "Coordinate (0–5)",
        "edit_value": "New value",
        "edit_button": "Set the coordinate",
        "edit_summary": "W_E[{row}, {dim}] ({word}): {old:+.3f} → {new:+.3f}.",
        "edit_changed": "Positions whose vector changed: {positions} (the occurrences of id {row}); every other position: max change {other:g}.",
        "edit_nothing": "Id {row} does not occur in the ids, so no looked-up vector changed.",
        # ---- 4. step
        "step_heading": "4. One training step: input “{input}”, target “{target}” (not “{rival}”)",
        "step_explain": (
            "Two frozen output vectors turn the input row into two logits; one plain SGD step "
            "(gradient from jax.grad) updates the table."
        ),
        "step_lr": "Learning rate",
        "step_button": "Take a training step",
        "reset_button": "Reset the table",
        "step_p": "p({target})",
        "step_loss": "loss",
        "step_gap": "gap g = logit_{target} − logit_{rival}",
        "step_before": "before",
        "step_after": "after",
        "step_count": "Steps taken on this table: {n}.",
        "step_grad": "The gradient dloss/dW_E (only the rows that were read are non-zero)",
        "step_rows": "Rows changed by the step: {rows}; the other rows are bit-identical.",
        "step_outputs": "Frozen output vectors",
        "reset_done": "The table is the article's again (ids, rows and steps reset).",
        # ---- 5. context
        "context_heading": "5. Context: the same token at the same position, different after attention",
        "context_explain": (
            "Input x = embedding + sinusoidal position; one causal attention head with identity "
            "Q, K and V projections."
        ),
        "context_a": "Sentence A",
        "context_b": "Sentence B",
        "context_button": "Compute",
        "equal_button": "Make them equal",
        "context_inputs": "At the last word “{word}” (position {pos}): the inputs differ by max {diff:g}",
        "context_outputs": "The attention outputs there differ by max {diff:g}",
        "context_same_input": "identical inputs",
        "context_different_output": "different outputs: the head mixed in the context",
        "context_same_output": "identical outputs: the sentences are the same",
        "context_lengths": "The sentences have different lengths, so only the inputs and outputs at each last word are compared.",
        "context_weights": "Attention weights, “{sentence}” (row: query, column: key)",
        "context_vectors": "At “{word}”",
        "context_input_row": "input x ({sentence})",
        "context_output_row": "output ({sentence})",
        # ---- 6. positions
        "positions_heading": "6. Positions: each pair of dimensions oscillates at its own rate, like the hands of a clock",
        "positions_dim": "Width D (even)",
        "positions_pos": "Position",
        "positions_pair": "Pair i",
        "positions_length": "Positions shown",
        "positions_button": "Show",
        "positions_values": (
            "ω_{pair} = 1/10000^(2·{pair}/{dim}) = {omega:.4g} rad per position (one turn every "
            "{period:.4g} positions). PE({pos}, {even}) = sin({pos}·ω) = {sin:+.4f}; "
            "PE({pos}, {odd}) = cos({pos}·ω) = {cos:+.4f}."
        ),
        "positions_heatmap": "The sinusoidal table: position × dimension",
        "positions_dimension": "dimension (pairs 2i, 2i+1: sin, cos)",
        "positions_position": "position",
        "positions_similarity": "P[{pos}] · P[{pos} + k] as a function of the offset k",
        "positions_offset": "offset k",
        "positions_dot": "dot product",
        "positions_clock": "Position {pos} as clock hands: pair i points at angle {pos}·ω_i",
        # ---- input errors
        "malformed_list": "{field}: “{text}” is not a list of whole numbers; write e.g. [0, 1, 0].",
        "empty_list": "{field}: the list is empty; type at least one id, e.g. [0, 1, 0].",
        "not_an_id": "{field}: “{item}” is not a whole number; ids are 0 to {high}, e.g. [0, 1, 0].",
        "id_out_of_range": "{field}: id {id} is out of range; the table has rows 0 to {high}.",
        "permutation_length": "permutation: it must list each id 0 to {high} once ({size} numbers), got {got}.",
        "permutation_repeat": "permutation: id {id} appears twice and {missing} is missing; list each id once.",
        "not_a_number": "{field}: “{text}” is not a number; write e.g. 0.4.",
        "not_finite": "{field}: {text} is not a finite number; write e.g. 0.4.",
        "not_an_integer": "{field}: “{text}” is not a whole number; use {low} to {high}.",
        "out_of_bounds": "{field}: {value} is out of range; use {low} to {high}.",
        "odd_width": "width D: {value} is odd; the sinusoids come in (sin, cos) pairs, so use an even width such as {even}.",
        "empty_sentence": "sentence: it is empty; use the words {vocab}.",
        "unknown_word": "sentence: “{word}” is not in the vocabulary; use the words {vocab}.",
        # ---- field names inside the messages above
        "field_ids": "ids",
        "field_permutation": "permutation",
        "field_learning_rate": "learning rate",
        "field_row": "row",
        "field_dimension": "coordinate",
        "field_value": "new value",
        "field_width": "width D",
        "field_position": "position",
        "field_pair": "pair i",
        "field_length": "positions shown",
    },
    "es": {
        # ---- página
        "title": "minigpt-jax: laboratorio de embeddings",
        "intro": (
            "Seis tokens, seis coordenadas cada uno: una tabla de embeddings W_E (6×6) que comparten "
            "todas las partes de esta página. Renombrar ids, editar una coordenada y dar un paso de "
            "entrenamiento cambian esa misma tabla, y las partes siguientes la leen. Cada número lo "
            "calcula el código JAX de minigpt_jax (las mismas funciones que `experiments/`)."
        ),
        "table_heading": "La tabla compartida W_E (filas: ids de token, columnas: coordenadas)",
        "error_prefix": "Error en la entrada",
        "kept_state": "no se ha cambiado nada.",
        # ---- 1. búsqueda
        "lookup_heading": "1. Búsqueda: un id de token lee una fila de la tabla",
        "lookup_ids": "Ids de token (una lista, p. ej. [0, 1, 0])",
        "lookup_button": "Buscar",
        "lookup_rows": "Filas leídas (resaltadas)",
        "lookup_result": "El resultado x, forma ({t}, {d}): la fila t es W_E[id_t]",
        "lookup_one_hot": "max |x − one_hot(ids) · W_E| = {diff:g}: la búsqueda es igual al producto one-hot.",
        "lookup_repeat": "El id {id} ({word}) se repite en las posiciones {positions}: vectores idénticos (diferencia máxima {diff:g}).",
        "lookup_no_repeat": "Ningún id se repite; escribe uno dos veces, p. ej. [0, 1, 0], para ver vectores idénticos.",
        # ---- 2. renombrar
        "rename_heading": "2. Renombrar los ids: los ids solo son nombres de filas",
        "rename_ids": "Ids de token que buscar",
        "rename_perm": "Permutación π (el id i pasa a ser π[i]), p. ej. [5, 3, 0, 1, 2, 4]",
        "rename_mode": "Renombrar",
        "mode_both": "ids y filas a la vez",
        "mode_ids": "solo los ids",
        "mode_rows": "solo las filas",
        "rename_button": "Renombrar",
        "rename_before": "Antes: ids {ids}",
        "rename_after": "Después: ids {ids}",
        "rename_same": "max |x_después − x_antes| = {diff:g}: el resultado no cambia.",
        "rename_changed": "max |x_después − x_antes| = {diff:g}: el resultado cambia, porque solo se renombró un lado.",
        "rename_applied": "La tabla compartida y su vocabulario usan ahora los ids nuevos.",
        "rename_not_applied": "Esto era un supuesto: la tabla compartida no cambia.",
        # ---- 3. editar
        "edit_heading": "3. Editar una coordenada: cambia cada aparición de ese token, nada más",
        "edit_ids": "Ids de token que buscar",
        "edit_row": "Fila (id de token)",
        "edit_dim": "Coordenada (0–5)",
        "edit_value": "Valor nuevo",
        "edit_button": "Fijar la coordenada",
        "edit_summary": "W_E[{row}, {dim}] ({word}): {old:+.3f} → {new:+.3f}.",
        "edit_changed": "Posiciones cuyo vector cambió: {positions} (las apariciones del id {row}); el resto de posiciones: cambio máximo {other:g}.",
        "edit_nothing": "El id {row} no aparece en los ids, así que ningún vector buscado cambió.",
        # ---- 4. paso
        "step_heading": "4. Un paso de entrenamiento: entrada «{input}», objetivo «{target}» (no «{rival}»)",
        "step_explain": (
            "Dos vectores de salida congelados convierten la fila de entrada en dos logits; un paso "
            "de SGD simple (gradiente de jax.grad) actualiza la tabla."
        ),
        "step_lr": "Tasa de aprendizaje",
        "step_button": "Dar un paso de entrenamiento",
        "reset_button": "Restablecer la tabla",
        "step_p": "p({target})",
        "step_loss": "pérdida",
        "step_gap": "brecha g = logit_{target} − logit_{rival}",
        "step_before": "antes",
        "step_after": "después",
        "step_count": "Pasos dados sobre esta tabla: {n}.",
        "step_grad": "El gradiente dpérdida/dW_E (solo las filas leídas son distintas de cero)",
        "step_rows": "Filas que cambió el paso: {rows}; las demás filas son idénticas bit a bit.",
        "step_outputs": "Vectores de salida congelados",
        "reset_done": "La tabla vuelve a ser la del artículo (ids, filas y pasos restablecidos).",
        # ---- 5. contexto
        "context_heading": "5. Contexto: el mismo token en la misma posición, distinto tras la atención",
        "context_explain": (
            "Entrada x = embedding + posición sinusoidal; una cabeza de atención causal con "
            "proyecciones Q, K y V identidad."
        ),
        "context_a": "Frase A",
        "context_b": "Frase B",
        "context_button": "Calcular",
        "equal_button": "Igualarlas",
        "context_inputs": "En la última palabra «{word}» (posición {pos}): las entradas difieren como máximo {diff:g}",
        "context_outputs": "Las salidas de la atención ahí difieren como máximo {diff:g}",
        "context_same_input": "entradas idénticas",
        "context_different_output": "salidas distintas: la cabeza mezcló el contexto",
        "context_same_output": "salidas idénticas: las frases son iguales",
        "context_lengths": "Las frases tienen longitudes distintas, así que solo se comparan las entradas y salidas en cada última palabra.",
        "context_weights": "Pesos de atención, «{sentence}» (fila: consulta, columna: clave)",
        "context_vectors": "En «{word}»",
        "context_input_row": "entrada x ({sentence})",
        "context_output_row": "salida ({sentence})",
        # ---- 6. posiciones
        "positions_heading": "6. Posiciones: cada par de dimensiones oscila a su propio ritmo, como las agujas de un reloj",
        "positions_dim": "Anchura D (par)",
        "positions_pos": "Posición",
        "positions_pair": "Par i",
        "positions_length": "Posiciones mostradas",
        "positions_button": "Mostrar",
        "positions_values": (
            "ω_{pair} = 1/10000^(2·{pair}/{dim}) = {omega:.4g} rad por posición (una vuelta cada "
            "{period:.4g} posiciones). PE({pos}, {even}) = sin({pos}·ω) = {sin:+.4f}; "
            "PE({pos}, {odd}) = cos({pos}·ω) = {cos:+.4f}."
        ),
        "positions_heatmap": "La tabla sinusoidal: posición × dimensión",
        "positions_dimension": "dimensión (pares 2i, 2i+1: sin, cos)",
        "positions_position": "posición",
        "positions_similarity": "P[{pos}] · P[{pos} + k] en función del desplazamiento k",
        "positions_offset": "desplazamiento k",
        "positions_dot": "producto escalar",
        "positions_clock": "La posición {pos} como agujas de reloj: el par i apunta al ángulo {pos}·ω_i",
        # ---- errores de entrada
        "malformed_list": "{field}: «{text}» no es una lista de números enteros; escribe p. ej. [0, 1, 0].",
        "empty_list": "{field}: la lista está vacía; escribe al menos un id, p. ej. [0, 1, 0].",
        "not_an_id": "{field}: «{item}» no es un número entero; los ids van de 0 a {high}, p. ej. [0, 1, 0].",
        "id_out_of_range": "{field}: el id {id} está fuera de rango; la tabla tiene las filas 0 a {high}.",
        "permutation_length": "permutación: debe listar cada id de 0 a {high} una vez ({size} números), y tiene {got}.",
        "permutation_repeat": "permutación: el id {id} aparece dos veces y falta el {missing}; lista cada id una vez.",
        "not_a_number": "{field}: «{text}» no es un número; escribe p. ej. 0.4.",
        "not_finite": "{field}: {text} no es un número finito; escribe p. ej. 0.4.",
        "not_an_integer": "{field}: «{text}» no es un número entero; usa de {low} a {high}.",
        "out_of_bounds": "{field}: {value} está fuera de rango; usa de {low} a {high}.",
        "odd_width": "anchura D: {value} es impar; las sinusoides van en pares (sin, cos), así que usa una anchura par como {even}.",
        "empty_sentence": "frase: está vacía; usa las palabras {vocab}.",
        "unknown_word": "frase: «{word}» no está en el vocabulario; usa las palabras {vocab}.",
        # ---- nombres de campo dentro de los mensajes anteriores
        "field_ids": "ids",
        "field_permutation": "permutación",
        "field_learning_rate": "tasa de aprendizaje",
        "field_row": "fila",
        "field_dimension": "coordenada",
        "field_value": "valor nuevo",
        "field_width": "anchura D",
        "field_position": "posición",
        "field_pair": "par i",
        "field_length": "posiciones mostradas",
    },
}


def message(lang: str, key: str, **params) -> str:
    """TEXT[lang][key] formatted with params; a `field` param is itself a key (field_<name>)."""
    if lang not in TEXT:
        raise ValueError(f"language {lang!r} is not one of {', '.join(LANGUAGES)}.")
    words = TEXT[lang]
    if "field" in params:
        params = {**params, "field": words[f"field_{params['field']}"]}
    return words[key].format(**params)
