{#-- dbt `view` models over consistent_stream sources.

  Spark resolves a view's relations when it creates it, and it cannot read a Delta table
  (no Delta jars here), so before dbt-spark creates a view this adapter publishes every
  `format: delta` source with meta.consistent_stream that the view reads (directly or
  through ephemeral models) at its latest version, as dbt's relation for the source
  (consistent_stream.sink.catalog.publish_source). A consistent_stream model that refs the
  view is maintained over the same sources (its SQL expanded), not over this snapshot. --#}

{% macro consistent_spark__create_view_as(relation, sql) -%}
  {%- set sources = [] -%}
  {%- do consistent_stream_view_sources(model, sources, []) -%}
  {%- if sources -%}
    {%- do adapter.consistent_stream_publish_sources(sources) -%}
  {%- endif -%}
  {{ spark__create_view_as(relation, sql) }}
{%- endmacro %}


{% macro consistent_stream_view_sources(node, sources, seen) %}
  {#-- The sources with meta.consistent_stream that node reads, through ephemeral models --#}
  {%- for uid in node.depends_on.nodes if uid not in seen -%}
    {%- do seen.append(uid) -%}
    {%- if uid.startswith('source.') -%}
      {%- set stream_meta = consistent_stream_source_meta(graph.sources[uid]) -%}
      {%- if stream_meta -%}
        {%- do sources.append(consistent_stream_source_dict(graph.sources[uid], stream_meta)) -%}
      {%- endif -%}
    {%- elif graph.nodes.get(uid) is not none and graph.nodes[uid].config.materialized == 'ephemeral' -%}
      {%- do consistent_stream_view_sources(graph.nodes[uid], sources, seen) -%}
    {%- endif -%}
  {%- endfor -%}
{% endmacro %}
