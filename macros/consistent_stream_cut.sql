{#--
  consistent_stream_cut(models): several consistent_stream models read at one cut.

  Returns a dict model name -> relation: each model's target at the newest versions of all
  of them that share one base cut (the DAG cut rule; `consistent-stream cut` prints the same
  versions), as a temporary view of that version in dbt's Spark session. For dbt tests and
  analyses that compare several marts:

    {% set at = consistent_stream_cut(['order_revenue', 'nation_revenue']) %}
    select ... from {{ at['nation_revenue'] }} n cross join {{ at['order_revenue'] }} o

  At parse time it returns ref() of each model, so dbt records the dependencies.
--#}
{% macro consistent_stream_cut(models) %}
  {%- set refs = {} -%}
  {%- for m in models -%}
    {%- do refs.update({m: ref(m)}) -%}
  {%- endfor -%}
  {%- if not execute -%}
    {%- do return(refs) -%}
  {%- endif -%}
  {%- do return(adapter.consistent_stream_cut(models)) -%}
{% endmacro %}
