{#--
  dedup_before_join(relation, key, order_by): the first row per `key` of a changelog-like
  relation, ordered by `order_by`, as a derived table to join to:

    select o.order_id, p.status
    from {{ source('shop', 'orders') }} o
    join {{ dedup_before_join(source('shop', 'payment_events'), 'order_id', 'event_seq desc') }} p
      on p.order_id = o.order_id

  Why: an event table holds several versions of each entity, and they can arrive late or
  twice. Joined raw, every version joins (a payment shows up once per event), and which one
  the view shows depends on arrival order. Deduplicated first, each key joins exactly its
  newest version by `order_by`: an event that arrives late with an older sequence sorts
  behind the current row and changes nothing; a repeated event is the same row; and when
  the newest version is deleted, the next one takes its place.

  It expands to `ROW_NUMBER() OVER (PARTITION BY key ORDER BY order_by) = 1`, which
  consistent_stream maintains incrementally (a dedup operator), and which batch SQL
  evaluates the same way. Ties in `order_by` are broken by the remaining columns ascending;
  batch engines pick an arbitrary row among ties, so give a total order (add the event's
  id) when ties can happen.

  key: a column name or a list of them; order_by: an ORDER BY list, e.g. 'event_seq desc'.
--#}
{% macro dedup_before_join(relation, key, order_by) -%}
  {%- set keys = [key] if key is string else key -%}
  {%- if not keys or keys | select('string') | map('trim') | select | list | length != keys | length -%}
    {%- do exceptions.raise_compiler_error("dedup_before_join: `key` must be a column name or a list of column names, got " ~ (key | tojson)) -%}
  {%- endif -%}
  {%- if order_by is not string or not order_by | trim -%}
    {%- do exceptions.raise_compiler_error("dedup_before_join: `order_by` must be an ORDER BY list such as 'event_seq desc', got " ~ (order_by | tojson)) -%}
  {%- endif -%}
  (select * except (__cs_row_number) from (
    select __cs_changelog.*,
           row_number() over (partition by {{ keys | join(', ') }} order by {{ order_by }}) as __cs_row_number
    from {{ relation }} as __cs_changelog
  ) as __cs_ranked where __cs_row_number = 1)
{%- endmacro %}
