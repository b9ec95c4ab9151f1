{#-- `dbt clone` on this adapter: dbt-spark's clone for every other node; for a consistent_stream
  model, what dbt-spark gives a Delta `table`. Its target is always a Delta table, though the
  model sets no `file_format` (which dbt-spark's clone requires): when prod's relation is a
  table, the dev relation is a Delta shallow clone of it (`create or replace table ..
  shallow clone ..`: a table of its own whose log points at prod's files), else a view over
  it. Either is a plain relation, not a consistent_stream target: the model's next `dbt run`
  replaces it with a target of its own, as after any other materialization. An existing dev
  relation is kept unless --full-refresh, as dbt-spark keeps it. --#}

{%- materialization clone, adapter='consistent_spark' -%}
  {%- if config.get('materialized') != 'consistent_stream' -%}
    {{ return(materialization_clone_spark()) }}
  {%- endif -%}

  {%- if not defer_relation -%}
    {{ log("No relation found in state manifest for " ~ model.unique_id, info=True) }}
    {{ return({'relations': []}) }}
  {%- endif -%}

  {%- set existing_relation = load_cached_relation(this) -%}
  {%- if existing_relation and not flags.FULL_REFRESH -%}
    {{ log("Relation " ~ existing_relation ~ " already exists", info=True) }}
    {{ return({'relations': []}) }}
  {%- endif -%}

  {%- set prod_relation = load_cached_relation(defer_relation) -%}
  {%- if prod_relation and prod_relation.type == 'table' -%}
    {%- set target_relation = this.incorporate(type='table') -%}
    {%- if existing_relation is not none and not existing_relation.is_table -%}
      {{ drop_relation_if_exists(existing_relation) }}
    {%- endif -%}
    {% call statement('main') %}
      {{ create_or_replace_clone(target_relation, defer_relation) }}
    {% endcall %}
    {% do persist_docs(target_relation, model) %}
    {{ return({'relations': [target_relation]}) }}
  {%- endif -%}
  {{ return(materialization_view_spark()) }}
{%- endmaterialization -%}
