{#--
  snapshot_then_cdc(source_name, table_name): a table captured from a database as its
  snapshot at position P0 followed by the change events after P0 (no gap, no overlap), read
  from a CDC landing directory (`consistent-stream capture postgres`, Debezium JSON), or from
  Debezium's topics on Kafka (format: kafka: the connector's initial snapshot, op r, is P0).

  Renders exactly like source(source_name, table_name), so the model keeps its batch meaning:
  the relation is the *current table* (snapshot + every change up to the cut). Batch
  evaluation (`consistent-stream verify`) and `dbt run --full-refresh` read it as such, and a
  consistent_stream model reads it as a changelog cut only at transaction boundaries, the same
  position for every table of the landing directory.

  The source needs, in its YAML:
    meta:
      consistent_stream:
        format: debezium
        location: <landing directory>       # relative to the dbt project directory
        table: <schema>.<table>             # the captured table, e.g. public.pgbench_accounts
        primary_key: [..]                   # optional
--#}
{% macro snapshot_then_cdc(source_name, table_name) -%}
  {%- set relation = source(source_name, table_name) -%}
  {%- if execute -%}
    {%- set node = graph.sources.values() | selectattr('source_name', 'equalto', source_name)
                                          | selectattr('name', 'equalto', table_name) | first -%}
    {%- set config_meta = node.config.meta if node.config is defined and node.config.meta else {} -%}
    {%- set meta = node.meta.get('consistent_stream') or config_meta.get('consistent_stream') or {} -%}
    {%- set problems = [] -%}
    {%- set fmt = (meta.get('format') or '') | lower -%}
    {%- if fmt not in ('debezium', 'kafka') -%}
      {%- do problems.append('meta.consistent_stream.format must be debezium or kafka (it is ' ~ (meta.get('format') | tojson) ~ ')') -%}
    {%- elif fmt == 'kafka' -%}
      {%- for key in ('bootstrap_servers', 'topic') -%}
        {%- if not meta.get(key) -%}
          {%- do problems.append('meta.consistent_stream.' ~ key ~ ' is missing') -%}
        {%- endif -%}
      {%- endfor -%}
    {%- else -%}
      {%- if not meta.get('location') -%}
        {%- do problems.append('meta.consistent_stream.location (the landing directory) is missing') -%}
      {%- endif -%}
      {%- if '.' not in (meta.get('table') or '') -%}
        {%- do problems.append('meta.consistent_stream.table (schema.table of the captured table) is missing') -%}
      {%- endif -%}
    {%- endif -%}
    {%- if problems -%}
      {%- set msg -%}
snapshot_then_cdc('{{ source_name }}', '{{ table_name }}') in model {{ model.name }}: {{ problems | join('; ') }}.
Declare the source as a captured table, e.g.
  - name: {{ table_name }}
    meta:
      consistent_stream:
        format: debezium
        location: data/landing
        table: public.{{ table_name }}
      {%- endset -%}
      {%- do exceptions.raise_compiler_error(msg) -%}
    {%- endif -%}
  {%- endif -%}
  {{- return(relation) -}}
{%- endmacro %}
