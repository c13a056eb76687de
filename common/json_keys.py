"""Reading a key of a JSON column in a query, for the passes over many rows.

`values_list("status_data__idle_checks")` reads the key, but Django first tries the whole
path as fields and relations, and keeps the FieldError it catches (setup_joins'
last_field_exception) with its traceback in a reference cycle: the traceback's frames hold
their callers' frames and so every local of the pass that made the query. Reference
counting can then free none of the pass's objects (10^5 of them); they wait for the cyclic
collector, which a pass pauses (common.collector), so the first collection after it walks
and frees them all (0.13-0.19 s of CPU after a 10,000-session scheduling pass).
An annotation names the column alone, and no error is raised.
"""

from django.db.models.fields.json import KeyTransform


def json_key(path):
    """The expression of `column__key[__key…]`, the decoded JSON value (None if absent):
    `.annotate(reports=json_key("status_data__idle_checks")).values_list("reports")`."""
    column, *keys = path.split("__")
    expression = column
    for key in keys:
        expression = KeyTransform(key, expression)
    return expression
