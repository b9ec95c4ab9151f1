{#-- Config validation and source collection for the consistent_stream materialization. --#}

{% macro consistent_stream_is_string_list(value) -%}
  {#-- true when value is a non-empty list of non-empty strings --#}
  {%- do return(value is iterable and value is not string and value is not mapping
                and value | length > 0
                and value | select('string') | map('trim') | select | list | length == value | length) -%}
{%- endmacro %}


{% macro consistent_stream_validate_unique_key(unique_key) %}
  {%- if unique_key is none -%}
    {%- do return(none) -%}
  {%- elif unique_key is string and unique_key | trim -%}
    {%- do return(unique_key) -%}
  {%- elif consistent_stream_is_string_list(unique_key) -%}
    {%- do return(unique_key | list) -%}
  {%- endif -%}
  {%- set msg -%}
Invalid config `unique_key` for consistent_stream model {{ model.name }}: {{ unique_key | tojson }}.
`unique_key` is the column (a string) or columns (a list of strings) that identify a row of the
model's result, e.g. unique_key='l_orderkey' or unique_key=['l_returnflag', 'l_linestatus'],
in config() or in the model's YAML config. Leave it unset to use the key inferred from the SQL
(GROUP BY keys, source primary keys through joins); a result without one is kept as a bag.
  {%- endset -%}
  {%- do exceptions.raise_compiler_error(msg) -%}
{% endmacro %}


{% macro consistent_stream_validate_partition_by(partition_by) %}
  {%- if partition_by is none or (partition_by is string and partition_by | trim) -%}
    {%- do return(partition_by) -%}
  {%- elif consistent_stream_is_string_list(partition_by) -%}
    {%- do return(partition_by | list) -%}
  {%- endif -%}
  {%- set msg -%}
Invalid config `partition_by` for consistent_stream model {{ model.name }}: {{ partition_by | tojson }}.
Expected a column name (a string) or a list of column names, or leave it unset.
  {%- endset -%}
  {%- do exceptions.raise_compiler_error(msg) -%}
{% endmacro %}


{% macro consistent_stream_validate_file_format(file_format) %}
  {%- if file_format is not none and file_format != 'delta' -%}
    {%- set msg -%}
Invalid config `file_format` for consistent_stream model {{ model.name }}: {{ file_format | tojson }}.
A consistent_stream target is a Delta table: set file_format='delta' or leave it unset.
    {%- endset -%}
    {%- do exceptions.raise_compiler_error(msg) -%}
  {%- endif -%}
{% endmacro %}


{% macro consistent_stream_model_sources(model) %}
  {#-- The model's inputs, through the ephemeral and view models it refs (dbt inlines an
       ephemeral model as a CTE; the engine expands a view's SQL), one dict each:
       * a dbt source: {source_name, name, relation, meta}, meta being the table's
         meta.consistent_stream, relation source(a, b) as it renders;
       * an upstream consistent_stream model: {kind: 'model', name, relation, schema,
         identifier, config: {location_root, checkpoint_location}};
       * a view model: {kind: 'view', name, relation};
       * a table, incremental, snapshot or seed (a Delta table dbt builds): {source_name: 'ref',
         name, relation, meta: {}, primary_key}, read as a source found by its catalog name.
       ref() of any other materialization is a compiler error naming it. --#}
  {%- set inputs = [] -%}
  {%- do consistent_stream_collect_inputs(model, model, inputs, []) -%}
  {%- do return(inputs) -%}
{% endmacro %}


{% macro consistent_stream_collect_inputs(model, node, inputs, seen) %}
  {%- for uid in node.depends_on.nodes if uid not in seen -%}
    {%- do seen.append(uid) -%}
    {%- if uid.startswith('source.') -%}
      {%- do inputs.append(consistent_stream_source_input(model, graph.sources[uid])) -%}
    {%- else -%}
      {%- set up = graph.nodes.get(uid) -%}
      {%- set materialized = up.config.materialized if up is not none else none -%}
      {%- set at = consistent_stream_ref_relation(up) if up is not none and materialized != 'ephemeral' else none -%}
      {%- set relation = api.Relation.create(database=at.database, schema=at.schema, identifier=at.identifier) | string
          if at is not none else '' -%}
      {%- if materialized == 'consistent_stream' -%}
        {%- do inputs.append({'kind': 'model', 'name': up.name, 'relation': relation, 'schema': at.schema,
                              'identifier': at.identifier,
                              'config': {'location_root': up.config.get('location_root'),
                                         'checkpoint_location': up.config.get('checkpoint_location')}}) -%}
      {%- elif materialized in ('ephemeral', 'view') -%}
        {%- do consistent_stream_collect_inputs(model, up, inputs, seen) -%}
        {%- if materialized == 'view' -%}
          {%- do inputs.append({'kind': 'view', 'name': up.name, 'relation': relation}) -%}
        {%- endif -%}
      {%- elif materialized in ('table', 'incremental', 'snapshot', 'seed') -%}
        {#-- a Delta table dbt builds: read as a source by its catalog name (its log's changes) --#}
        {%- do inputs.append({'source_name': 'ref', 'name': up.name, 'relation': relation, 'meta': {},
                              'primary_key': consistent_stream_built_key(up)}) -%}
      {%- else -%}
        {%- set msg -%}
consistent_stream model {{ model.name }} reads {{ uid }}{{ (', a `' ~ materialized ~ '` model') if materialized else '' }}.
A consistent_stream model is maintained from changelogs: it reads sources, and models dbt builds as
Delta tables (table, incremental, snapshot, seed), consistent_stream, view and ephemeral models; a
{{ materialized or 'node of this kind' }} is none of those. Make {{ up.name if up is not none else uid }} one of them, or read its data
as a dbt source.
        {%- endset -%}
        {%- do exceptions.raise_compiler_error(msg) -%}
      {%- endif -%}
    {%- endif -%}
  {%- endfor -%}
{% endmacro %}


{% macro consistent_stream_ref_relation(node) %}
  {#-- The relation ref() gives for node here: prod's under `--defer` (dbt's ref() decides), the
       table itself (not dbt's `--empty` subquery) --#}
  {%- set version = node.get('version') -%}
  {%- set r = ref(node.package_name, node.name, v=version) if version is not none
      else ref(node.package_name, node.name) -%}
  {%- do return(api.Relation.create(database=r.database, schema=r.schema, identifier=r.identifier)) -%}
{% endmacro %}


{% macro consistent_stream_source_meta(node) %}
  {#-- A source node's meta.consistent_stream (under meta or config.meta), or none --#}
  {%- set config_meta = node.config.meta if node.config is defined and node.config.meta else {} -%}
  {%- do return(node.meta.get('consistent_stream') or config_meta.get('consistent_stream')) -%}
{% endmacro %}


{% macro consistent_stream_source_dict(node, stream_meta) %}
  {#-- The engine's description of a dbt source: {source_name, name, relation, meta, primary_key};
       meta is {} for a source named only by its table in the catalog. The relation is the table's
       name as source() renders it, never dbt's `--empty` subquery of it --#}
  {%- do return({
      'source_name': node.source_name,
      'name': node.name,
      'relation': api.Relation.create(database=node.database, schema=node.schema, identifier=node.identifier) | string,
      'meta': stream_meta or {},
      'primary_key': consistent_stream_constraint_key(node),
  }) -%}
{% endmacro %}


{% macro consistent_stream_source_input(model, node) %}
  {#-- A source with meta.consistent_stream, or without: then the Delta table its relation names
       in Spark's catalog (the engine looks it up and says what it found) --#}
  {%- do return(consistent_stream_source_dict(node, consistent_stream_source_meta(node))) -%}
{% endmacro %}


{% macro consistent_stream_constraint_key(node) %}
  {#-- The primary key dbt's constraints declare on a node: a model-level primary_key constraint's
       columns, else the columns with a column-level one; [] when none does --#}
  {%- for c in node.get('constraints') or [] -%}
    {%- if c.get('type') == 'primary_key' and c.get('columns') -%}
      {%- do return(c.get('columns') | list) -%}
    {%- endif -%}
  {%- endfor -%}
  {%- set key = [] -%}
  {%- for name, col in (node.get('columns') or {}).items() -%}
    {%- for c in col.get('constraints') or [] if c.get('type') == 'primary_key' -%}
      {%- do key.append(col.get('name') or name) -%}
    {%- endfor -%}
  {%- endfor -%}
  {%- do return(key) -%}
{% endmacro %}


{% macro consistent_stream_built_key(node) %}
  {#-- The key of a model dbt builds as a table: its constraints' primary key; else a merge
       incremental's unique_key (a merge keeps it unique), a snapshot's dbt_scd_id; else [] --#}
  {%- set key = consistent_stream_constraint_key(node) -%}
  {%- if key -%}
    {%- do return(key) -%}
  {%- endif -%}
  {%- set unique_key = node.config.get('unique_key') -%}
  {%- if node.config.materialized == 'snapshot' -%}
    {%- do return(['dbt_scd_id']) -%}
  {%- elif node.config.materialized == 'incremental' and unique_key
        and node.config.get('incremental_strategy') == 'merge' -%}
    {%- do return([unique_key] if unique_key is string else unique_key | list) -%}
  {%- endif -%}
  {%- do return([]) -%}
{% endmacro %}


{% macro consistent_stream_contract(model) %}
  {#-- The model's enforced contract: {columns: [{name, data_type}], constraints: [{type,
       columns, expression, name}]}, both empty when `contract: {enforced: true}` is not set
       (dbt applies constraints only under an enforced contract). The engine checks the
       columns against the SQL's output before anything is written and enforces not_null and
       check constraints at every batch; other constraint types get a warning. --#}
  {%- set out = {'columns': [], 'constraints': []} -%}
  {%- if not (model.get('contract') or {}).get('enforced') -%}
    {%- do return(out) -%}
  {%- endif -%}
  {#-- the model (a dict here) and its columns and constraints are dicts: .get(), not attributes --#}
  {%- for column in model.get('columns', {}).values() -%}
    {%- do out.columns.append({'name': column.get('name'), 'data_type': column.get('data_type')}) -%}
    {%- for c in column.get('constraints') or [] -%}
      {%- do out.constraints.append({'type': c.get('type'), 'columns': [column.get('name')],
                                     'expression': c.get('expression'), 'name': c.get('name')}) -%}
    {%- endfor -%}
  {%- endfor -%}
  {%- for c in model.get('constraints') or [] -%}
    {%- do out.constraints.append({'type': c.get('type'), 'columns': c.get('columns') or [],
                                   'expression': c.get('expression'), 'name': c.get('name')}) -%}
  {%- endfor -%}
  {%- for c in out.constraints if c.type not in ('not_null', 'check') -%}
    {%- do exceptions.warn('consistent_stream model ' ~ model.name ~ ': its ' ~ c.type ~ ' constraint'
                           ~ (' ' ~ c.name if c.name else '') ~ ' on ' ~ (c.columns | join(', '))
                           ~ ' is not enforced (consistent_stream enforces not_null and check; unique_key is the key '
                           ~ 'every batch checks for uniqueness)') -%}
  {%- endfor -%}
  {%- do return(out) -%}
{% endmacro %}


{% macro consistent_stream_warn_grants(grants) %}
  {#-- Open-source Spark has no GRANT: say so (once per model run) instead of ignoring
       `grants` silently. --#}
  {%- if grants -%}
    {%- do exceptions.warn('consistent_stream model ' ~ model.name ~ ': `grants` (' ~ (grants | tojson) ~ ') are not applied: open-source Spark '
                           ~ 'has no GRANT (its catalog has no access control). Apply them in the catalog that '
                           ~ 'governs these tables (Unity Catalog, Ranger, ...), or remove the config') -%}
  {%- endif -%}
{% endmacro %}


{% macro consistent_stream_docs(model) %}
  {#-- dbt's persist_docs for the engine: {description, columns: {name: description}} with the
       model's description when `persist_docs: {relation: true}` and its columns' when
       `columns: true`; none without either. The engine writes them into the target's Delta
       metadata (table description, column comments) when it is created or rebuilt, and into
       the catalog's table at every run. --#}
  {%- set relation = config.persist_relation_docs() -%}
  {%- set columns = config.persist_column_docs() -%}
  {%- if not (relation or columns) -%}
    {%- do return(none) -%}
  {%- endif -%}
  {%- set out = {'description': model.get('description') if relation else none, 'columns': {}} -%}
  {%- if columns -%}
    {%- for column in model.get('columns', {}).values() if column.get('description') -%}
      {%- do out.columns.update({column.get('name'): column.get('description')}) -%}
    {%- endfor -%}
  {%- endif -%}
  {%- do return(out) -%}
{% endmacro %}
